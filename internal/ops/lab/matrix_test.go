package lab

import (
	"strings"
	"testing"
)

func TestMatrixRender(t *testing.T) {
	m := NewMatrix([]string{"node1-pod1", "node2-pod1", "node3-pod1"})
	for i := range m.OK {
		for j := range m.OK[i] {
			m.OK[i][j] = i != j
			m.TCP[i][j] = i != j
		}
	}
	m.OK[2][0], m.TCP[2][0] = false, false
	m.TCP[0][1] = false // ping passes, TCP does not
	var b strings.Builder
	if err := m.Render(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"4/6 pairs reachable (ping and TCP)", "✗", "·", "ping"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.HasSuffix(strings.TrimSpace(lines[3]), "✗          ✓          ·") {
		t.Errorf("unexpected layout:\n%s", out)
	}
	if f := m.Failures(); len(f) != 2 || f[0] != "node1-pod1 → node2-pod1 (tcp)" || f[1] != "node3-pod1 → node1-pod1 (ping, tcp)" {
		t.Errorf("Failures() = %v", f)
	}
}

func TestOptions(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{"defaults", Options{Nodes: 3}, ""},
		{"no pods", Options{Nodes: 3, PodsPerNode: 0}, ""},
		{"mixed", Options{Nodes: 3, Backend: BackendMixed}, ""},
		{"no nodes", Options{Nodes: 0}, "nodes 0: must be 1..250"},
		{"bad backend", Options{Backend: "udp"}, "backend"},
		{"too many nodes", Options{Nodes: 300}, "nodes"},
		{"negative pods", Options{Nodes: 3, PodsPerNode: -1}, "pods per node"},
		{"long state dir", Options{Nodes: 3, StateDir: "/tmp/" + strings.Repeat("x", 120)}, "unix socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := tt.opts.withDefaults()
			if tt.wantErr == "" {
				if err != nil || o.Nodes != tt.opts.Nodes || o.PodsPerNode != tt.opts.PodsPerNode || o.Backend == "" {
					t.Fatalf("withDefaults: %+v, %v", o, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.wantErr)
			}
		})
	}
	o := Options{Backend: BackendMixed}
	if o.NodeBackend(1) != BackendVXLAN || o.NodeBackend(2) != BackendUVXLAN || o.NodeBackend(3) != BackendVXLAN {
		t.Fatal("mixed must alternate vxlan, uvxlan, vxlan")
	}
}
