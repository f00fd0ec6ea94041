package lab

import (
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/test/e2e"
)

// TestMixedLabTCP runs the lab in mixed mode with its default link settings
// (no offload turned off anywhere): a kernel VXLAN node and a uvxlan node.
// TCP must work both ways between every pair of pods on different nodes,
// and 100 MB cross between the kernel node's pod and the uvxlan node's pod
// intact (sha256) in both directions.
func TestMixedLabTCP(t *testing.T) {
	bin := weftctl(t)
	dir := filepath.Join(t.TempDir(), "lab")
	up := labUp(t, bin, dir, "--nodes", "2", "--pods-per-node", "2", "--backend", "mixed")
	defer func() {
		up.cmd.Process.Signal(syscall.SIGINT)
		if err := up.wait(t, 40*time.Second); err != nil {
			t.Errorf("lab up after SIGINT: %v:\n%s", err, up.out.String())
		}
	}()
	st, err := LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{st.Nodes[0].Backend, st.Nodes[1].Backend}; !slices.Equal(got, []string{"vxlan", "uvxlan"}) {
		t.Fatalf("mixed lab backends: %v", got)
	}
	pods := map[string]*nettest.NS{}
	for _, p := range st.Pods {
		ns, err := namespace.OpenNamed(p.NS)
		if err != nil {
			t.Fatal(err)
		}
		if ns.Handle != nil {
			t.Cleanup(func() { ns.Handle.Close() }) // the lab owns the namespace itself
		}
		pods[p.Name] = ns
	}
	for _, src := range st.Pods {
		for _, dst := range st.Pods {
			if src.Node == dst.Node {
				continue
			}
			size := int64(1 << 20)
			if src.Name == "node1-pod1" && dst.Name == "node2-pod1" || src.Name == "node2-pod1" && dst.Name == "node1-pod1" {
				size = 100 << 20
			}
			rate, err := e2e.Transfer(pods[src.Name], pods[dst.Name], dst.IP, size)
			if err != nil {
				t.Errorf("tcp %s → %s (%s): %v", src.Name, dst.Name, dst.IP, err)
				continue
			}
			t.Logf("tcp %s → %s: %d MiB at %.2f Gb/s", src.Name, dst.Name, size>>20, rate*8/1e9)
		}
	}
}
