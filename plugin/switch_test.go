package plugin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
	"github.com/weft-net/weft/subnet"
)

// switchNode is a plugin test node (env) running kube-flannel.yml's
// conflist with Flannel's chain (flannel) or weft's plugin as "flannel"
// (Weft), through plugintest.FlannelNode.
type switchNode struct {
	*plugintest.FlannelNode
	e       *env
	file    subnet.File
	flannel *plugintest.Node // Flannel's chain
}

// newSwitchNode prepares the node. ipamDataDir, if set, is added to the
// flannel entry as ipam.dataDir; otherwise the entry is kube-flannel.yml's
// with only subnetFile added.
func newSwitchNode(t *testing.T, ipamDataDir string) *switchNode {
	t.Helper()
	n := &switchNode{file: v4File(true)}
	n.e = newEnv(t, &n.file)
	n.FlannelNode = plugintest.NewFlannelNode(t, n.e.node, nettest.Binary(t, "weft"), n.e.subnetFile, ipamDataDir)
	n.flannel = n.Flannel(t)
	return n
}

// gc runs GC of the conflist (at cniVersion 1.1.0, which has GC) through
// weft with valid as the runtime's attachments.
func (n *switchNode) gc(t *testing.T, valid []*plugintest.Pod) {
	t.Helper()
	node := n.Conflist(t, "1.1.0", n.Entry)
	var atts []types.GCAttachment
	for _, p := range valid {
		atts = append(atts, types.GCAttachment{ContainerID: p.ID, IfName: "eth0"})
	}
	if err := n.CNI.GCNetworkList(context.Background(), node.List, &libcni.GCArgs{ValidAttachments: atts}); err != nil {
		t.Fatalf("GC: %v", err)
	}
}

func without(pods []*plugintest.Pod, gone *plugintest.Pod) []*plugintest.Pod {
	return slices.DeleteFunc(slices.Clone(pods), func(p *plugintest.Pod) bool { return p == gone })
}

// TestSwitchFlannelWeftFlannel (issue 29): a node moves from Flannel's CNI
// chain to weft's plugin (installed as "flannel", same conflist) and back,
// pods running. No address is handed out twice: weft and host-local
// share one store. weft's DEL frees what host-local reserved, host-local
// sees what weft reserved, and weft's GC releases only reservations absent
// from the runtime's list, whoever made them.
func TestSwitchFlannelWeftFlannel(t *testing.T) {
	for _, c := range []struct {
		name    string
		ipamDir bool
	}{{"default store", false}, {"ipam dataDir", true}} {
		t.Run(c.name, func(t *testing.T) {
			var ipamDir string
			if c.ipamDir {
				ipamDir = t.TempDir()
			}
			n := newSwitchNode(t, ipamDir)
			flannel := n.AddPods(t, n.flannel, "flannel", 5)
			live := flannel
			n.CheckStore(t, live)

			weft := n.AddPods(t, n.Weft, "weft", 5) // the node now runs weft
			live = append(live, weft...)
			n.CheckStore(t, live)
			ping(t, weft[0].NS, flannel[1].IP)
			ping(t, flannel[2].NS, weft[1].IP)

			gone := flannel[0]
			if err := n.Weft.Del(gone); err != nil {
				t.Fatalf("weft's DEL of %s: %v", gone.ID, err)
			}
			if _, err := os.Stat(filepath.Join(n.Store, gone.IP.String())); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s's reservation of %s after weft's DEL: %v", gone.ID, gone.IP, err)
			}
			live = without(live, gone)
			n.gc(t, live)
			n.CheckStore(t, live) // GC kept every listed pod's, host-local's included

			again := n.AddPods(t, n.flannel, "again", 5) // back to Flannel
			live = append(live, again...)
			n.CheckStore(t, live)
			ping(t, again[0].NS, weft[2].IP)

			stale := again[4] // its runtime lost it: not in GC's list
			n.gc(t, without(live, stale))
			if _, err := os.Stat(filepath.Join(n.Store, stale.IP.String())); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("GC kept the reservation of %s, which the runtime did not list: %v", stale.ID, err)
			}
			live = without(live, stale)
			n.CheckStore(t, live)

			for _, p := range live {
				if err := n.Weft.Del(p); err != nil {
					t.Errorf("weft's DEL of %s: %v", p.ID, err)
				}
			}
			if left := plugintest.StoreFiles(t, filepath.Dir(n.Store), "cbr0"); len(left) != 0 {
				t.Errorf("reservations left after weft's DEL of every pod: %v", left)
			}
			if c.ipamDir {
				if _, err := os.Stat(filepath.Join(n.VarLib, "cni", "networks")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("a store at the default path though ipam.dataDir is set: %v", err)
				}
			}
		})
	}
}

// TestDelOfFlannelPod (issue 41): after a takeover, weft's DEL of pods that
// Flannel's chain wired (the real bridge and host-local plugins) removes
// what the bridge plugin's DEL removes: the pod's eth0 and with it its host
// veth on cni0, whose name weft did not choose, and frees the address. The
// other pods keep theirs and still talk; a second DEL succeeds.
func TestDelOfFlannelPod(t *testing.T) {
	n := newSwitchNode(t, "")
	pods := n.AddPods(t, n.flannel, "flannel", 3)
	n.CheckStore(t, pods)
	gone := pods[0]
	var host string
	for _, i := range gone.Result.Interfaces {
		if i.Sandbox == "" && i.Name != "cni0" {
			host = i.Name
		}
	}
	if host == "" {
		t.Fatalf("no host veth in the bridge plugin's result: %v", gone.Result.Interfaces)
	}
	for range 2 {
		if err := n.Weft.Del(gone); err != nil {
			t.Fatalf("weft's DEL of %s: %v", gone.ID, err)
		}
	}
	if got := linkNames(t, gone.NS); !sameSet(got, []string{"lo"}) {
		t.Errorf("links in %s's namespace after weft's DEL: %v, want lo only", gone.ID, got)
	}
	if _, err := n.e.node.Handle.LinkByName(host); err == nil {
		t.Errorf("host veth %s of %s still there after weft's DEL", host, gone.ID)
	}
	if ports := n.e.bridgePorts(t); len(ports) != 2 {
		t.Errorf("bridge ports after weft's DEL: %v, want the 2 other pods'", ports)
	}
	n.CheckStore(t, pods[1:]) // gone's address is free, the others' held
	ping(t, pods[1].NS, pods[2].IP)
}
