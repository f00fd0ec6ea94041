package plugin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
)

// flannelPlugin is Flannel's CNI plugin on a switch node: the real binary
// (github.com/flannel-io/cni-plugin, named by WEFT_FLANNEL_CNI) or, where
// there is none (the Go module proxy does not serve it), what its code
// does: ADD hands bridge the delegate configuration (plugintest.FlannelDelegate; the
// switch node's Flannel chain) and writes it to <dataDir>/<containerID>,
// DEL reads <dataDir>/<containerID> and, if
// it exists, runs its type's DEL with it and removes it, else does nothing.
type flannelPlugin struct {
	n    *switchNode
	real *plugintest.Node // nil: as its code does
}

func newFlannelPlugin(t *testing.T, n *switchNode) *flannelPlugin {
	bin := os.Getenv("WEFT_FLANNEL_CNI")
	if bin == "" {
		t.Log("WEFT_FLANNEL_CNI is not set: Flannel's DEL is run as its code runs it (state file, then the delegate's DEL)")
		return &flannelPlugin{n: n}
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("WEFT_FLANNEL_CNI: %v", err)
	}
	t.Logf("Flannel's plugin: %s", bin)
	return &flannelPlugin{n: n, real: &plugintest.Node{NS: n.e.node, CNI: n.Plugins(t, bin), List: n.Weft.List}}
}

func (f *flannelPlugin) add(t *testing.T, id string, count int) []*plugintest.Pod {
	if f.real != nil {
		return f.n.AddPods(t, f.real, id, count)
	}
	pods := f.n.AddPods(t, f.n.flannel, id, count)
	d := plugintest.FlannelDelegate(f.n.Entry, f.n.file)
	d["name"], d["cniVersion"] = "cbr0", "0.3.1"
	dir := filepath.Join(f.n.VarLib, "cni", "flannel")
	for _, p := range pods { // Flannel writes its state file
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p.ID), mustJSON(t, d), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return pods
}

func (f *flannelPlugin) del(t *testing.T, p *plugintest.Pod) error {
	if f.real != nil {
		return f.real.Del(p)
	}
	path := filepath.Join(f.n.VarLib, "cni", "flannel", p.ID)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	conf, err := libcni.ConfFromBytes(b)
	if err != nil {
		return err
	}
	if err := f.n.CNI.DelNetwork(context.Background(), conf, p.RT); err != nil {
		return err
	}
	return os.Remove(path)
}

// TestRollbackToFlannel (issue 29): weft, installed as "flannel", wires
// pods and leaves Flannel's state file for each; the node is rolled back
// to Flannel's plugin, whose DEL of those pods then frees their addresses
// and deletes their interfaces (without the file it returns success and
// frees nothing). Flannel's plugin wires new pods beside weft's, and weft's
// DEL of one of those removes the state file Flannel wrote.
func TestRollbackToFlannel(t *testing.T) {
	n := newSwitchNode(t, "")
	weft := n.AddPods(t, n.Weft, "weft", 3)
	n.CheckStore(t, weft)
	state := filepath.Join(n.VarLib, "cni", "flannel")
	for _, p := range weft {
		if _, err := os.Stat(filepath.Join(state, p.ID)); err != nil {
			t.Fatalf("weft wrote no Flannel state file for %s: %v", p.ID, err)
		}
	}

	fl := newFlannelPlugin(t, n) // rolled back
	gone := weft[0]
	if err := fl.del(t, gone); err != nil {
		t.Fatalf("Flannel's DEL of %s: %v", gone.ID, err)
	}
	if _, err := os.Stat(filepath.Join(n.Store, gone.IP.String())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Flannel's DEL left the reservation of %s (%s): %v", gone.ID, gone.IP, err)
	}
	if out := nettest.MustRun(t, gone.NS, "ip", "-o", "link"); strings.Contains(out, "eth0") {
		t.Errorf("Flannel's DEL left %s's eth0:\n%s", gone.ID, out)
	}
	if ports := n.e.bridgePorts(t); len(ports) != 2 {
		t.Errorf("bridge ports after Flannel's DEL: %v, want the 2 other pods'", ports)
	}
	if _, err := os.Stat(filepath.Join(state, gone.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state file of %s after Flannel's DEL: %v", gone.ID, err)
	}
	live := without(weft, gone)
	n.CheckStore(t, live)

	again := fl.add(t, "flannel", 3)
	live = append(live, again...)
	n.CheckStore(t, live)
	if fl.real != nil { // the file weft writes is the one Flannel writes
		ours, err1 := os.ReadFile(filepath.Join(state, weft[2].ID))
		theirs, err2 := os.ReadFile(filepath.Join(state, again[1].ID))
		if err1 != nil || err2 != nil || string(ours) != string(theirs) {
			t.Errorf("weft's state file %s (%v)\nFlannel's %s (%v)", ours, err1, theirs, err2)
		}
	}
	ping(t, again[0].NS, weft[1].IP)

	if err := fl.del(t, weft[1]); err != nil {
		t.Fatalf("Flannel's DEL of %s: %v", weft[1].ID, err)
	}
	live = without(live, weft[1])
	n.CheckStore(t, live)

	if err := n.Weft.Del(again[0]); err != nil { // forward again: weft's DEL of Flannel's pod
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(state, again[0].ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Flannel's state file of %s after weft's DEL: %v", again[0].ID, err)
	}
	n.CheckStore(t, without(live, again[0]))
}
