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
		}
	}
	m.OK[2][0] = false
	var b strings.Builder
	if err := m.Render(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"5/6 pairs reachable", "✗", "·"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.HasSuffix(strings.TrimSpace(lines[3]), "✗          ✓          ·") {
		t.Errorf("unexpected layout:\n%s", out)
	}
	if f := m.Failures(); len(f) != 1 || f[0] != "node3-pod1 → node1-pod1" {
		t.Errorf("Failures() = %v", f)
	}
}

func TestOptions(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{"defaults", Options{}, ""},
		{"mixed", Options{Backend: BackendMixed}, ""},
		{"bad backend", Options{Backend: "udp"}, "backend"},
		{"too many nodes", Options{Nodes: 300}, "nodes"},
		{"negative pods", Options{PodsPerNode: -1}, "pods per node"},
		{"long state dir", Options{StateDir: "/tmp/" + strings.Repeat("x", 120)}, "unix socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := tt.opts.withDefaults()
			if tt.wantErr == "" {
				if err != nil || o.Nodes != 3 && tt.opts.Nodes == 0 {
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
