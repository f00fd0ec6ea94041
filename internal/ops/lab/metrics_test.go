package lab

import "testing"

func TestMetrics(t *testing.T) {
	text := `# HELP weft_peers Remote node subnets.
# TYPE weft_peers gauge
weft_peers{family="ipv4"} 2
weft_peers{family="ipv6"} 1
weft_ready 1
weft_repairs_total{kind="route",x="a}b"} 3
weft_repairs_total{kind="fdb"} 0
bad_line{
weft_peer_table_build_seconds_sum 1.5e-05
`
	m := Metrics(text)
	tests := []struct {
		name string
		want float64
		ok   bool
	}{
		{"weft_peers", 3, true},
		{"weft_ready", 1, true},
		{"weft_repairs_total", 3, true},
		{"weft_peer_table_build_seconds_sum", 1.5e-05, true},
		{"bad_line", 0, false},
		{"absent", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, ok := m[tt.name]
			if v != tt.want || ok != tt.ok {
				t.Fatalf("%s = %v, %v; want %v, %v", tt.name, v, ok, tt.want, tt.ok)
			}
		})
	}
}
