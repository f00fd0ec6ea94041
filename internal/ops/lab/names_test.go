package lab

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPrefix(t *testing.T) {
	tests := []struct {
		name, dir, want string
	}{
		{"default dir", DefaultStateDir, "weftlab-"},
		{"default dir unclean", DefaultStateDir + "/", "weftlab-"},
		{"other dir", "/tmp/x", "weftlab-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Prefix(tt.dir)
			if !strings.HasPrefix(got, tt.want) || !strings.HasSuffix(got, "-") {
				t.Fatalf("Prefix(%q) = %q", tt.dir, got)
			}
		})
	}
	if Prefix("/tmp/x") == BasePrefix || Prefix("/tmp/x") == Prefix("/tmp/y") {
		t.Fatalf("other dirs must get distinct prefixes: %q %q", Prefix("/tmp/x"), Prefix("/tmp/y"))
	}
	if Prefix("/tmp/x") != Prefix("/tmp/x/") {
		t.Fatal("prefix must not depend on a trailing slash")
	}
}

func TestParseName(t *testing.T) {
	tests := []struct {
		name      string
		node, pod int
		ok        bool
	}{
		{"sw", 0, 0, true},
		{"node1", 1, 0, true},
		{"node12-pod3", 12, 3, true},
		{"node0", 0, 0, false},
		{"node1-pod0", 0, 0, false},
		{"node1-", 0, 0, false},
		{"pod1", 0, 0, false},
		{"node01", 0, 0, false},
		{"", 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, p, ok := ParseName(tt.name)
			if n != tt.node || p != tt.pod || ok != tt.ok {
				t.Fatalf("ParseName(%q) = %d, %d, %v; want %d, %d, %v", tt.name, n, p, ok, tt.node, tt.pod, tt.ok)
			}
		})
	}
}

func TestOwnsNamespace(t *testing.T) {
	other := Prefix("/tmp/some-test")
	tests := []struct {
		name   string
		prefix string
		ns     string
		want   bool
	}{
		{"default node", BasePrefix, "weftlab-node1", true},
		{"default pod", BasePrefix, "weftlab-node1-pod2", true},
		{"default switch", BasePrefix, "weftlab-sw", true},
		{"default does not claim another lab's", BasePrefix, other + "node1", false},
		{"other lab's own", other, other + "node3-pod1", true},
		{"tests' namespaces", BasePrefix, "wefttest-node1", false},
		{"unrelated suffix", BasePrefix, "weftlab-node1-x", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := OwnsNamespace(tt.prefix, tt.ns); got != tt.want {
				t.Fatalf("OwnsNamespace(%q, %q) = %v", tt.prefix, tt.ns, got)
			}
		})
	}
}

func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadState(dir); err == nil || !strings.Contains(err.Error(), "no lab") {
		t.Fatalf("empty dir: %v", err)
	}
	st := &State{Prefix: "weftlab-", Switch: "weftlab-sw",
		Nodes: []NodeState{{Name: "node1", NS: "weftlab-node1"}},
		Pods:  []PodState{{Name: "node1-pod1", Node: "node1", NS: "weftlab-node1-pod1"}}}
	if err := st.Save(dir); err != nil {
		t.Fatal(err)
	}
	got, err := LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"node1", "node1-pod1", "sw"} {
		if _, err := got.NamespaceOf(name); err != nil {
			t.Errorf("NamespaceOf(%q): %v", name, err)
		}
	}
	if _, err := got.NamespaceOf("node2"); err == nil || !strings.Contains(err.Error(), "node1-pod1") {
		t.Errorf("unknown name: %v (should list the known ones)", err)
	}
	if n := len(got.Names()); n != 3 {
		t.Errorf("Names() has %d entries", n)
	}
	if err := removeFiles(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, stateFile)); !os.IsNotExist(err) {
		t.Fatalf("lab.json left: %v", err)
	}
}
