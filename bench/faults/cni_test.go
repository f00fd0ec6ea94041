package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
	"github.com/weft-net/weft/subnet"
)

// cniNode is a node namespace with a subnet file and the weft plugin.
type cniNode struct {
	ns                 *nettest.NS
	bin, file, dataDir string
}

func newCNINode(t *testing.T) *cniNode {
	t.Helper()
	n := &cniNode{ns: nettest.NewNS(t, "node"), bin: nettest.Binary(t, "weft")}
	dir := t.TempDir()
	n.file, n.dataDir = filepath.Join(dir, "subnet.env"), filepath.Join(dir, "data")
	f := subnet.File{Network: netip.MustParsePrefix("10.244.0.0/16"), Subnet: netip.MustParsePrefix("10.244.59.1/24"), MTU: 1450}
	if err := subnet.WriteFile(n.file, f); err != nil {
		t.Fatal(err)
	}
	return n
}

// leftovers counts what pods left behind: reserved addresses in the store,
// links on the node other than lo and cni0, files other than the store's
// lock and round-robin markers.
func (n *cniNode) leftovers(t *testing.T) (addrs, links, files int) {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(n.dataDir, "weft"))
	for _, e := range entries {
		switch {
		case e.Name() == "lock" || strings.HasPrefix(e.Name(), "last_reserved_ip."):
		case isAddr(e.Name()):
			addrs++
		default:
			files++
		}
	}
	for _, l := range splitLines(nettest.MustRun(t, n.ns, "ip", "-o", "link", "show")) {
		f := strings.SplitN(l, ": ", 3)
		if len(f) > 1 {
			if name := strings.SplitN(f[1], "@", 2)[0]; name != "lo" && name != "cni0" {
				links++
			}
		}
	}
	return addrs, links, files
}

func isAddr(s string) bool { _, err := netip.ParseAddr(s); return err == nil }

// TestParallelAddDel: N pods ADDed at once, then DELed at once, and DEL
// repeated twice more (a runtime retries DEL). Goal: no duplicate address,
// no DEL failure, nothing left.
func TestParallelAddDel(t *testing.T) {
	pods := scale(30, 200)
	n := newCNINode(t)
	node := plugintest.NewNode(t, n.ns, n.bin, n.file, plugintest.Options{DataDir: n.dataDir})
	nss := make([]*nettest.NS, pods)
	for i := range nss {
		nss[i] = nettest.NewNS(t, fmt.Sprintf("p%d", i))
	}
	got := make([]*plugintest.Pod, pods)
	addErrs := each(pods, func(i int) (err error) {
		got[i], err = node.Add(nss[i], fmt.Sprintf("pod-%d", i))
		return err
	})
	seen := map[netip.Addr]bool{}
	dups := 0
	for _, p := range got {
		if p == nil {
			continue
		}
		if seen[p.IP] {
			dups++
		}
		seen[p.IP] = true
	}
	delErrs := 0
	for range 3 {
		delErrs += each(pods, func(i int) error {
			if got[i] == nil {
				return nil
			}
			return node.Del(got[i])
		})
	}
	addrs, links, files := n.leftovers(t)
	record(t, row{fmt.Sprintf("%d parallel ADDs, then %d parallel DELs repeated 3×", pods, pods),
		"ADD failures; duplicate addresses; DEL failures; leftover addresses, links, files",
		fmt.Sprintf("%d; %d; %d; %d, %d, %d", addErrs, dups, delErrs, addrs, links, files),
		"0; 0; 0; 0, 0, 0", addErrs == 0 && dups == 0 && delErrs == 0 && addrs+links+files == 0, ""})
}

// each runs f(0..n-1) concurrently and returns how many failed.
func each(n int, f func(i int) error) int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	for i := range n {
		wg.Go(func() {
			if err := f(i); err != nil {
				mu.Lock()
				failed++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// TestKilledAdd: the plugin is killed with SIGKILL at a random point of ADD,
// N times; then every pod is DELed and the network GCed with no valid
// attachment, as a runtime recovering does. Goal: nothing leaked.
func TestKilledAdd(t *testing.T) {
	runs := scale(10, 100)
	n := newCNINode(t)
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 14))
	killed := 0
	var ids []string
	var pods []*nettest.NS
	for i := range runs {
		pod := nettest.NewNS(t, fmt.Sprintf("k%d", i))
		id := fmt.Sprintf("killed-%d", i)
		ids, pods = append(ids, id), append(pods, pod)
		if n.killAdd(t, id, pod, time.Duration(r.IntN(40000))*time.Microsecond) {
			killed++
		}
	}
	delErrs := 0
	for i, id := range ids {
		if out, err := n.exec(t, "DEL", id, pods[i].Path, nil); err != nil {
			delErrs++
			t.Logf("DEL %s: %v: %s", id, err, out)
		}
	}
	if out, err := n.exec(t, "GC", "", "", map[string]any{"cni.dev/valid-attachments": []any{}}); err != nil {
		t.Errorf("GC: %v: %s", err, out)
	}
	addrs, links, files := n.leftovers(t)
	record(t, row{fmt.Sprintf("kill -9 of the CNI plugin at a random point (0–40 ms) of ADD ×%d, then DEL and GC", runs),
		"ADDs killed before they finished; DEL failures; leaked addresses, leftover links, files",
		fmt.Sprintf("%d; %d; %d, %d, %d", killed, delErrs, addrs, links, files),
		"—; 0; 0, 0, 0", delErrs == 0 && addrs+links+files == 0, ""})
}

// killAdd starts ADD for id and kills it after d; it reports whether the
// plugin was still running then.
func (n *cniNode) killAdd(t *testing.T, id string, pod *nettest.NS, d time.Duration) bool {
	t.Helper()
	cmd := n.command(t, "ADD", id, pod.Path, nil)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(d, func() { cmd.Process.Signal(syscall.SIGKILL) })
	err := cmd.Wait()
	timer.Stop()
	return err != nil
}

func (n *cniNode) exec(t *testing.T, command, id, netns string, extra map[string]any) (string, error) {
	t.Helper()
	cmd := n.command(t, command, id, netns, extra)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// command is the plugin run as a runtime runs it, inside the node.
func (n *cniNode) command(t *testing.T, command, id, netns string, extra map[string]any) *exec.Cmd {
	conf := map[string]any{"cniVersion": "1.1.0", "name": "weft", "type": "weft", "subnetFile": n.file, "dataDir": n.dataDir,
		"ipam": map[string]any{"dataDir": n.dataDir}}
	for k, v := range extra {
		conf[k] = v
	}
	stdin, _ := json.Marshal(conf)
	cmd := n.ns.Command(context.Background(), n.bin)
	cmd.Env = append(os.Environ(), "CNI_COMMAND="+command, "CNI_CONTAINERID="+id, "CNI_NETNS="+netns,
		"CNI_IFNAME=eth0", "CNI_PATH="+filepath.Dir(n.bin))
	cmd.Stdin = bytes.NewReader(stdin)
	return cmd
}
