package plugintest

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
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
)

// KubeFlannelConflist is the conflist kube-flannel.yml installs
// (cni-conf.json of kube-manifests/flannel-compat/kube-flannel.yml).
const KubeFlannelConflist = `{"name":"cbr0","cniVersion":"0.3.1","plugins":[` +
	`{"type":"flannel","delegate":{"hairpinMode":true,"isDefaultGateway":true}},` +
	`{"type":"portmap","capabilities":{"portMappings":true}}]}`

// FlannelNode is a node that runs kube-flannel.yml's conflist either with
// Flannel's CNI chain or with weft's plugin installed as "flannel". Every
// plugin runs in the node's network namespace and in a private mount
// namespace where a test directory is mounted on /var/lib, so the default
// paths (/var/lib/cni/networks, /var/lib/cni/flannel) are the test's own.
//
// Flannel's plugin (github.com/flannel-io/cni-plugin) is not served by the
// Go module proxy, so Flannel's chain is what that plugin executes: the
// bridge plugin with the delegate configuration it generates
// (FlannelDelegate), which delegates to host-local.
type FlannelNode struct {
	NS         *nettest.NS
	SubnetFile string
	PID        int               // the holder of the node's private mount namespace
	VarLib     string            // what the plugins see as /var/lib
	Store      string            // the address store's directory, as the test sees it
	Entry      map[string]any    // the flannel entry of the conflist
	CNI        *libcni.CNIConfig // "flannel" is weft's plugin
	Weft       *Node             // weft's plugin as "flannel"
}

// NewFlannelNode prepares the node ns, whose subnet file is subnetFile;
// weftBin is weft's plugin. ipamDataDir, if set, is added to the flannel
// entry as ipam.dataDir (Flannel hands that section to host-local);
// otherwise the entry is kube-flannel.yml's with only subnetFile added. It
// needs the reference plugins of WEFT_CNI_BIN and nsenter.
func NewFlannelNode(tb testing.TB, ns *nettest.NS, weftBin, subnetFile, ipamDataDir string) *FlannelNode {
	tb.Helper()
	n := &FlannelNode{NS: ns, SubnetFile: subnetFile}
	n.privateVarLib(tb)
	n.CNI = n.Plugins(tb, weftBin)
	var list map[string]any
	if err := json.Unmarshal([]byte(KubeFlannelConflist), &list); err != nil {
		tb.Fatal(err)
	}
	n.Entry = list["plugins"].([]any)[0].(map[string]any)
	n.Entry["subnetFile"] = subnetFile
	n.Store = filepath.Join(n.VarLib, "cni", "networks", "cbr0")
	if ipamDataDir != "" {
		n.Entry["ipam"] = map[string]any{"dataDir": ipamDataDir}
		n.Store = filepath.Join(ipamDataDir, "cbr0")
	}
	n.Weft = n.Conflist(tb, "0.3.1", n.Entry)
	return n
}

// Flannel returns Flannel's chain as Flannel's plugin would run it now:
// bridge with the delegate configuration built from the entry and the
// subnet file as it is at this call (Flannel's plugin reads it on every
// ADD).
func (n *FlannelNode) Flannel(tb testing.TB) *Node {
	tb.Helper()
	f, err := subnet.ReadFile(n.SubnetFile)
	if err != nil {
		tb.Fatalf("Flannel's chain: %v", err)
	}
	return n.Conflist(tb, "0.3.1", FlannelDelegate(n.Entry, f))
}

// Plugins returns a libcni config whose "flannel" is the binary flannel,
// beside the reference bridge, host-local and portmap. libcni starts each
// in the node's network namespace; it enters the holder's mount namespace
// (bridge, which delegates to host-local through CNI_PATH, starts
// host-local the same way, as Flannel's plugin starts bridge).
func (n *FlannelNode) Plugins(tb testing.TB, flannel string) *libcni.CNIConfig {
	tb.Helper()
	bin := tb.TempDir()
	ref := nettest.ReferencePlugins(tb)
	for name, path := range map[string]string{
		"flannel":    flannel,
		"bridge":     filepath.Join(ref, "bridge"),
		"host-local": filepath.Join(ref, "host-local"),
		"portmap":    filepath.Join(ref, "portmap"),
	} {
		script := fmt.Sprintf("#!/bin/sh\nexec nsenter --target %d --mount -- '%s'\n", n.PID, path)
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	return libcni.NewCNIConfigWithCacheDir([]string{bin}, tb.TempDir(),
		&NSExec{RawExec: invoke.RawExec{Stderr: os.Stderr}, NS: n.NS})
}

// Conflist returns kube-flannel.yml's conflist at cniVersion version with
// first as its first entry, run through n.CNI.
func (n *FlannelNode) Conflist(tb testing.TB, version string, first map[string]any) *Node {
	tb.Helper()
	var list map[string]any
	if err := json.Unmarshal([]byte(KubeFlannelConflist), &list); err != nil {
		tb.Fatal(err)
	}
	list["cniVersion"] = version
	list["plugins"].([]any)[0] = first
	b, _ := json.Marshal(list)
	l, err := libcni.NetworkConfFromBytes(b)
	if err != nil {
		tb.Fatal(err)
	}
	return &Node{NS: n.NS, CNI: n.CNI, List: l}
}

// FlannelDelegate is the configuration Flannel's plugin hands to its
// delegate for the flannel entry fl and the (IPv4) subnet file f: the
// entry's delegate keys; type bridge, ipMasq the opposite of
// FLANNEL_IPMASQ, mtu FLANNEL_MTU and (for a bridge) isGateway true where
// the delegate does not set them; as ipam, the entry's own ipam section
// (type host-local unless set, dataDir kept) with the node subnet as its
// range and a route to the cluster network. name and cniVersion are the
// network's (libcni sets them, as Flannel does).
func FlannelDelegate(fl map[string]any, f subnet.File) map[string]any {
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
// test directory mounted on /var/lib. The holder is killed, by its PID,
// when the test ends.
func (n *FlannelNode) privateVarLib(tb testing.TB) {
	tb.Helper()
	n.VarLib = tb.TempDir()
	before := mountsAt(tb, "/var/lib")
	cmd := n.NS.Command(context.Background(), "sh", "-c", `mount --bind "$1" /var/lib && exec sleep infinity`, "sh", n.VarLib)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start the mount holder: %v", err)
	}
	tb.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid))
		if err == nil && strings.HasPrefix(string(b), "sleep\x00") {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the mount holder is not ready: %q, %v", b, err)
		}
	}
	if after := mountsAt(tb, "/var/lib"); !slices.Equal(after, before) {
		tb.Fatalf("mounts on /var/lib of the test's own mount namespace changed: %v, were %v", after, before)
	}
	n.PID = cmd.Process.Pid
}

// mountsAt lists the mounts on dir in the test's mount namespace.
func mountsAt(tb testing.TB, dir string) []string {
	tb.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == dir {
			out = append(out, l)
		}
	}
	return out
}

// AddPods wires count pods id-1, id-2, … through node, each in a new
// namespace named after it. Nothing DELs them at the end: their namespaces
// go, and the node's with them.
func (n *FlannelNode) AddPods(tb testing.TB, node *Node, id string, count int) []*Pod {
	tb.Helper()
	var pods []*Pod
	for i := range count {
		name := fmt.Sprintf("%s-%d", id, i+1)
		p, err := node.Add(nettest.NewNS(tb, name), name)
		if err != nil {
			tb.Fatal(err)
		}
		pods = append(pods, p)
	}
	return pods
}

// CheckStore checks that the pods' addresses are distinct, that each is on
// the pod's eth0 and has its reservation file in host-local's format
// (content "containerID\r\nifname"), and that the store holds nothing
// else. It ends the test on a failure.
func (n *FlannelNode) CheckStore(tb testing.TB, pods []*Pod) {
	tb.Helper()
	seen := map[netip.Addr]string{}
	for _, p := range pods {
		if other, dup := seen[p.IP]; dup {
			tb.Errorf("%s and %s both have %s", other, p.ID, p.IP)
		}
		seen[p.IP] = p.ID
		if b, err := os.ReadFile(filepath.Join(n.Store, p.IP.String())); err != nil || string(b) != p.ID+"\r\neth0" {
			tb.Errorf("reservation of %s for %s: %q, %v", p.IP, p.ID, b, err)
		}
		if out := nettest.MustRun(tb, p.NS, "ip", "-4", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(out, " "+p.IP.String()+"/") {
			tb.Errorf("%s's eth0 does not hold %s: %s", p.ID, p.IP, out)
		}
	}
	if files := StoreFiles(tb, filepath.Dir(n.Store), filepath.Base(n.Store)); len(files) != len(pods) {
		tb.Errorf("store holds %v; want the %d pods' addresses", files, len(pods))
	}
	if tb.Failed() {
		tb.FailNow()
	}
}

// StoreFiles lists the address store of network name under dataDir, minus
// the files that persist on purpose (lock, last_reserved_ip.*).
func StoreFiles(tb testing.TB, dataDir, name string) []string {
	tb.Helper()
	entries, err := os.ReadDir(filepath.Join(dataDir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		tb.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		if e.Name() != "lock" && !strings.HasPrefix(e.Name(), "last_reserved_ip.") {
			left = append(left, e.Name())
		}
	}
	return left
}
