package plugin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
	"github.com/weft-net/weft/subnet"
)

// kubeFlannelConflist is the conflist kube-flannel.yml installs
// (cni-conf.json of kube-manifests/flannel-compat/kube-flannel.yml).
const kubeFlannelConflist = `{"name":"cbr0","cniVersion":"0.3.1","plugins":[` +
	`{"type":"flannel","delegate":{"hairpinMode":true,"isDefaultGateway":true}},` +
	`{"type":"portmap","capabilities":{"portMappings":true}}]}`

// switchNode is a node that runs kube-flannel.yml's conflist either with
// Flannel's CNI chain or with weft's plugin installed as "flannel". Every
// plugin runs in the node's network namespace and in a private mount
// namespace where a test directory is mounted on /var/lib, so the default
// paths (/var/lib/cni/networks, /var/lib/cni/weft) are the test's own.
//
// Flannel's plugin (github.com/flannel-io/cni-plugin) is not served by the
// Go module proxy, so Flannel's chain is what that plugin executes: the
// bridge plugin with the delegate configuration it generates
// (flannelDelegate), which delegates to host-local.
type switchNode struct {
	e       *env
	file    subnet.File
	pid     int            // the holder of the node's private mount namespace
	varLib  string         // what the plugins see as /var/lib
	store   string         // the address store's directory, as the test sees it
	entry   map[string]any // the flannel entry of the conflist
	cni     *libcni.CNIConfig
	flannel *plugintest.Node // Flannel's chain
	weft    *plugintest.Node // weft's plugin as "flannel"
}

// newSwitchNode prepares the node. ipamDataDir, if set, is added to the
// flannel entry as ipam.dataDir (Flannel hands that section to host-local);
// otherwise the entry is kube-flannel.yml's with only subnetFile added.
func newSwitchNode(t *testing.T, ipamDataDir string) *switchNode {
	t.Helper()
	n := &switchNode{file: v4File(true)}
	n.e = newEnv(t, &n.file)
	n.pid = n.privateVarLib(t)
	n.cni = n.plugins(t, nettest.Binary(t, "weft")) // weft's plugin installed as flannel

	var list map[string]any
	if err := json.Unmarshal([]byte(kubeFlannelConflist), &list); err != nil {
		t.Fatal(err)
	}
	n.entry = list["plugins"].([]any)[0].(map[string]any)
	n.entry["subnetFile"] = n.e.subnetFile
	n.store = filepath.Join(n.varLib, "cni", "networks", "cbr0")
	if ipamDataDir != "" {
		n.entry["ipam"] = map[string]any{"dataDir": ipamDataDir}
		n.store = filepath.Join(ipamDataDir, "cbr0")
	}
	n.weft = n.node(t, "0.3.1", n.entry)
	n.flannel = n.node(t, "0.3.1", flannelDelegate(n.entry, n.file))
	return n
}

// plugins returns a libcni config whose "flannel" is the binary flannel,
// beside the reference bridge, host-local and portmap. libcni starts each
// in the node's network namespace; it enters the holder's mount namespace
// (bridge, which delegates to host-local through CNI_PATH, starts
// host-local the same way, as Flannel's plugin starts bridge).
func (n *switchNode) plugins(t *testing.T, flannel string) *libcni.CNIConfig {
	t.Helper()
	bin := t.TempDir()
	ref := nettest.ReferencePlugins(t)
	for name, path := range map[string]string{
		"flannel":    flannel,
		"bridge":     filepath.Join(ref, "bridge"),
		"host-local": filepath.Join(ref, "host-local"),
		"portmap":    filepath.Join(ref, "portmap"),
	} {
		script := fmt.Sprintf("#!/bin/sh\nexec nsenter --target %d --mount -- '%s'\n", n.pid, path)
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return libcni.NewCNIConfigWithCacheDir([]string{bin}, t.TempDir(),
		&plugintest.NSExec{RawExec: invoke.RawExec{Stderr: os.Stderr}, NS: n.e.node})
}

// node returns kube-flannel.yml's conflist with first as its first entry.
func (n *switchNode) node(t *testing.T, version string, first map[string]any) *plugintest.Node {
	t.Helper()
	var list map[string]any
	if err := json.Unmarshal([]byte(kubeFlannelConflist), &list); err != nil {
		t.Fatal(err)
	}
	list["cniVersion"] = version
	list["plugins"].([]any)[0] = first
	b, _ := json.Marshal(list)
	l, err := libcni.NetworkConfFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return &plugintest.Node{NS: n.e.node, CNI: n.cni, List: l}
}

// flannelDelegate is the configuration Flannel's plugin hands to its
// delegate for the flannel entry fl and the (IPv4) subnet file f: the
// entry's delegate keys; type bridge, ipMasq the opposite of
// FLANNEL_IPMASQ, mtu FLANNEL_MTU and (for a bridge) isGateway true where
// the delegate does not set them; as ipam, the entry's own ipam section
// (type host-local unless set, dataDir kept) with the node subnet as its
// range and a route to the cluster network. name and cniVersion are the
// network's (libcni sets them, as Flannel does).
func flannelDelegate(fl map[string]any, f subnet.File) map[string]any {
	d := map[string]any{}
	for k, v := range fl["delegate"].(map[string]any) {
		d[k] = v
	}
	unset := func(k string, v any) {
		if _, ok := d[k]; !ok {
			d[k] = v
		}
	}
	unset("type", "bridge")
	unset("ipMasq", !f.IPMasq)
	unset("mtu", f.MTU)
	if d["type"] == "bridge" {
		unset("isGateway", true)
	}
	ipam := map[string]any{"type": "host-local"}
	if own, ok := fl["ipam"].(map[string]any); ok {
		for k, v := range own {
			ipam[k] = v
		}
	}
	ipam["ranges"] = [][]map[string]string{{{"subnet": f.Subnet.Masked().String()}}}
	ipam["routes"] = []map[string]string{{"dst": f.Network.Masked().String()}}
	d["ipam"] = ipam
	return d
}

// privateVarLib starts the holder of the node's private mount namespace
// (`ip netns exec` makes one, whose mounts do not propagate back) with a
// test directory mounted on /var/lib, and returns its PID. The holder is
// killed, by that PID, when the test ends.
func (n *switchNode) privateVarLib(t *testing.T) int {
	t.Helper()
	n.varLib = t.TempDir()
	before := mountsAt(t, "/var/lib")
	cmd := n.e.node.Command(context.Background(), "sh", "-c", `mount --bind "$1" /var/lib && exec sleep infinity`, "sh", n.varLib)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the mount holder: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid))
		if err == nil && strings.HasPrefix(string(b), "sleep\x00") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the mount holder is not ready: %q, %v", b, err)
		}
	}
	if after := mountsAt(t, "/var/lib"); !slices.Equal(after, before) {
		t.Fatalf("mounts on /var/lib of the test's own mount namespace changed: %v, were %v", after, before)
	}
	return cmd.Process.Pid
}

// mountsAt lists the mounts on dir in the test's mount namespace.
func mountsAt(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == dir {
			out = append(out, l)
		}
	}
	return out
}

// add wires count pods id-1, id-2, … through node.
func (n *switchNode) add(t *testing.T, node *plugintest.Node, id string, count int) []*plugintest.Pod {
	t.Helper()
	var pods []*plugintest.Pod
	for i := range count {
		name := fmt.Sprintf("%s-%d", id, i+1)
		p, err := node.Add(nettest.NewNS(t, name), name)
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	return pods
}

// checkStore: the pods' addresses are distinct, each is on the pod's eth0
// and has its reservation file (content "containerID\r\nifname"), and the
// store holds nothing else.
func (n *switchNode) checkStore(t *testing.T, pods []*plugintest.Pod) {
	t.Helper()
	seen := map[netip.Addr]string{}
	for _, p := range pods {
		if other, dup := seen[p.IP]; dup {
			t.Errorf("%s and %s both have %s", other, p.ID, p.IP)
		}
		seen[p.IP] = p.ID
		if b, err := os.ReadFile(filepath.Join(n.store, p.IP.String())); err != nil || string(b) != p.ID+"\r\neth0" {
			t.Errorf("reservation of %s for %s: %q, %v", p.IP, p.ID, b, err)
		}
		if out := nettest.MustRun(t, p.NS, "ip", "-4", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(out, " "+p.IP.String()+"/24 ") {
			t.Errorf("%s's eth0 does not hold %s: %s", p.ID, p.IP, out)
		}
	}
	if files := storeFiles(t, filepath.Dir(n.store), "cbr0"); len(files) != len(pods) {
		t.Errorf("store holds %v; want the %d pods' addresses", files, len(pods))
	}
	if t.Failed() {
		t.FailNow()
	}
}

// gc runs GC of the conflist (at cniVersion 1.1.0, which has GC) through
// weft with valid as the runtime's attachments.
func (n *switchNode) gc(t *testing.T, valid []*plugintest.Pod) {
	t.Helper()
	node := n.node(t, "1.1.0", n.entry)
	var atts []types.GCAttachment
	for _, p := range valid {
		atts = append(atts, types.GCAttachment{ContainerID: p.ID, IfName: "eth0"})
	}
	if err := n.cni.GCNetworkList(context.Background(), node.List, &libcni.GCArgs{ValidAttachments: atts}); err != nil {
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
			flannel := n.add(t, n.flannel, "flannel", 5)
			live := flannel
			n.checkStore(t, live)

			weft := n.add(t, n.weft, "weft", 5) // the node now runs weft
			live = append(live, weft...)
			n.checkStore(t, live)
			ping(t, weft[0].NS, flannel[1].IP)
			ping(t, flannel[2].NS, weft[1].IP)

			gone := flannel[0]
			if err := n.weft.Del(gone); err != nil {
				t.Fatalf("weft's DEL of %s: %v", gone.ID, err)
			}
			if _, err := os.Stat(filepath.Join(n.store, gone.IP.String())); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s's reservation of %s after weft's DEL: %v", gone.ID, gone.IP, err)
			}
			live = without(live, gone)
			n.gc(t, live)
			n.checkStore(t, live) // GC kept every listed pod's, host-local's included

			again := n.add(t, n.flannel, "again", 5) // back to Flannel
			live = append(live, again...)
			n.checkStore(t, live)
			ping(t, again[0].NS, weft[2].IP)

			stale := again[4] // its runtime lost it: not in GC's list
			n.gc(t, without(live, stale))
			if _, err := os.Stat(filepath.Join(n.store, stale.IP.String())); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("GC kept the reservation of %s, which the runtime did not list: %v", stale.ID, err)
			}
			live = without(live, stale)
			n.checkStore(t, live)

			for _, p := range live {
				if err := n.weft.Del(p); err != nil {
					t.Errorf("weft's DEL of %s: %v", p.ID, err)
				}
			}
			if left := storeFiles(t, filepath.Dir(n.store), "cbr0"); len(left) != 0 {
				t.Errorf("reservations left after weft's DEL of every pod: %v", left)
			}
			if c.ipamDir {
				if _, err := os.Stat(filepath.Join(n.varLib, "cni", "networks")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("a store at the default path though ipam.dataDir is set: %v", err)
				}
			}
		})
	}
}

// TestMigrateOldStore: an older weft release kept its own store at
// /var/lib/cni/weft/ipam/cbr0 and so gave pods the addresses of Flannel's
// (issue 29). The first ADD of this release moves that store into the
// shared one, but two addresses are held twice: it fails naming both
// holders of each, and gives the new pod nothing. Once one pod of each pair
// is deleted (weft's DEL frees in both stores) the move completes, the old
// directory is gone and ADD succeeds with an address nobody holds.
func TestMigrateOldStore(t *testing.T) {
	n := newSwitchNode(t, "")
	flannel := n.add(t, n.flannel, "flannel", 2)
	// An older release: its store was host-local's layout at
	// <dataDir>/ipam/<network>, what weft writes given that ipam.dataDir.
	oldEntry := map[string]any{"ipam": map[string]any{"dataDir": "/var/lib/cni/weft/ipam"}}
	for k, v := range n.entry {
		if k != "ipam" {
			oldEntry[k] = v
		}
	}
	old := n.add(t, n.node(t, "0.3.1", oldEntry), "old", 3)
	if old[0].IP != flannel[0].IP || old[1].IP != flannel[1].IP {
		t.Fatalf("the older release's pods got %s, %s; Flannel's %s, %s: not the issue's duplicates", old[0].IP, old[1].IP, flannel[0].IP, flannel[1].IP)
	}
	oldDir := filepath.Join(n.varLib, "cni", "weft", "ipam")

	pod := nettest.NewNS(t, "new")
	_, err := n.weft.Add(pod, "new-1")
	if err == nil || !strings.Contains(err.Error(), "reserved twice") {
		t.Fatalf("ADD with two addresses held twice: %v", err)
	}
	for _, w := range []string{flannel[0].IP.String(), "flannel-1/eth0", "old-1/eth0", flannel[1].IP.String(), "flannel-2/eth0", "old-2/eth0"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error does not name %s: %v", w, err)
		}
	}
	if out := nettest.MustRun(t, pod, "ip", "-o", "link"); strings.Contains(out, "eth0") {
		t.Errorf("the failed ADD left an eth0:\n%s", out)
	}
	n.checkStore(t, []*plugintest.Pod{flannel[0], flannel[1], old[2]}) // old-3's moved

	for _, p := range []*plugintest.Pod{old[0], flannel[1]} {
		if err := n.weft.Del(p); err != nil {
			t.Fatalf("weft's DEL of %s: %v", p.ID, err)
		}
	}
	fresh, err := n.weft.Add(pod, "new-1")
	if err != nil {
		t.Fatalf("ADD after one holder of each address is gone: %v", err)
	}
	n.checkStore(t, []*plugintest.Pod{flannel[0], old[1], old[2], fresh})
	if _, err := os.Stat(oldDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there after the move: %v", oldDir, err)
	}
}
