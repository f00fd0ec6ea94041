package lab

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/subnet"
)

// TestLabUpDown runs `weftctl lab up` with 3 nodes and 2 pods per node,
// checks the overlay end to end with the system's ping, checks leases,
// peers and explain against etcd and the kernel, and then checks that
// `weftctl lab down` leaves no namespace, link, process or file behind.
func TestLabUpDown(t *testing.T) {
	bin := weftctl(t)
	linksBefore, rootBefore := rootLinks(t), rootNetState(t)
	dir := filepath.Join(t.TempDir(), "lab")
	up := labUp(t, bin, dir, "--nodes", "3", "--pods-per-node", "2")
	if !strings.Contains(up.out.String(), "30/30 pairs reachable") {
		t.Fatalf("lab up's matrix is not complete:\n%s", up.out.String())
	}
	st, err := LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != 3 || len(st.Pods) != 6 || !st.Ready {
		t.Fatalf("state: %d nodes, %d pods, ready %v", len(st.Nodes), len(st.Pods), st.Ready)
	}
	t.Run("every pod pings every other pod", func(t *testing.T) { pingAll(t, st) })
	t.Run("a second lab up refuses", func(t *testing.T) {
		out, code := run(t, bin, "lab", "up", "--state-dir", dir)
		if code == 0 || !strings.Contains(out, "a lab is running") {
			t.Fatalf("second lab up: exit %d:\n%s", code, out)
		}
	})
	t.Run("status", func(t *testing.T) {
		out, code := run(t, bin, "lab", "status", "--state-dir", dir)
		ready := regexp.MustCompile(`ready, metrics: 3 leases, 2 peers, \d+ repairs, weft.1 with 2 peer routes`)
		if code != 0 || !strings.Contains(out, ", running,") || len(ready.FindAllString(out, -1)) != 3 {
			t.Fatalf("status: exit %d:\n%s", code, out)
		}
	})
	t.Run("leases match etcd", func(t *testing.T) { checkLeases(t, bin, dir, st) })
	t.Run("peers match the kernel and find drift", func(t *testing.T) { checkPeers(t, bin, dir, st) })
	t.Run("explain matches the kernel", func(t *testing.T) { checkExplain(t, bin, dir, st) })
	t.Run("status shows the repair", func(t *testing.T) {
		out, _ := run(t, bin, "lab", "status", "--state-dir", dir)
		m := regexp.MustCompile(`node1 .* (\d+) repairs`).FindStringSubmatch(out)
		if m == nil || m[1] == "0" {
			t.Fatalf("node1's weftd repaired a deleted route but its metrics do not show it:\n%s", out)
		}
	})

	out, code := run(t, bin, "lab", "down", "--state-dir", dir)
	if code != 0 || !strings.Contains(out, "lab removed") {
		t.Fatalf("lab down: exit %d:\n%s", code, out)
	}
	if err := up.wait(t, 30*time.Second); err != nil {
		t.Errorf("lab up exited with %v:\n%s", err, up.out.String())
	}
	assertGone(t, dir, st)
	if after := rootLinks(t); !slices.Equal(after, linksBefore) {
		t.Errorf("root namespace links changed:\nbefore %v\nafter  %v", linksBefore, after)
	}
	if after := rootNetState(t); after != rootBefore {
		t.Errorf("root namespace sysctls or nftables changed:\nbefore %s\nafter  %s", rootBefore, after)
	}
}

// TestLabUpAfterKill kills a lab with SIGKILL, so that it cannot clean up,
// and checks that the next lab up (mixed backends: vxlan and uvxlan nodes
// alternate) removes its debris (processes, namespaces) and works; then
// stops that one with SIGINT, as Ctrl-C does.
func TestLabUpAfterKill(t *testing.T) {
	bin := weftctl(t)
	dir := filepath.Join(t.TempDir(), "lab")
	first := labUp(t, bin, dir, "--nodes", "3", "--pods-per-node", "1")
	st1, err := LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	first.cmd.Process.Kill()
	first.wait(t, 10*time.Second)
	for _, n := range st1.Nodes {
		if !n.Weftd.Alive() {
			t.Fatalf("weftd of %s died with lab up: nothing left to clean, the test proves nothing", n.Name)
		}
	}
	if names, _ := ownedNamespaces(st1.Prefix); len(names) != len(st1.Names()) {
		t.Fatalf("after SIGKILL: namespaces %v, lab.json lists %v", names, st1.Names())
	}
	out, _ := run(t, bin, "lab", "status", "--state-dir", dir)
	if !strings.Contains(out, "NOT running") {
		t.Fatalf("status of a killed lab:\n%s", out)
	}

	second := labUp(t, bin, dir, "--nodes", "3", "--pods-per-node", "2", "--backend", "mixed")
	if !strings.Contains(second.out.String(), "30/30 pairs reachable") {
		t.Fatalf("second lab's matrix:\n%s", second.out.String())
	}
	for _, n := range st1.Nodes {
		if n.Weftd.Alive() {
			t.Errorf("weftd %d of the killed lab survived the second lab up", n.Weftd.PID)
		}
	}
	st2, err := LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	backends := []string{st2.Nodes[0].Backend, st2.Nodes[1].Backend, st2.Nodes[2].Backend}
	if !slices.Equal(backends, []string{"vxlan", "uvxlan", "vxlan"}) {
		t.Fatalf("mixed backends: %v", backends)
	}
	if out := ipIn(t, st2.Nodes[1].NS, "ip", "-d", "link", "show", "weft-u.1"); !strings.Contains(out, "tun") {
		t.Fatalf("node2 should carry the userspace VTEP's TAP:\n%s", out)
	}
	pingAll(t, st2)
	out, code := run(t, bin, "peers", "--lab", "--state-dir", dir)
	if code != 0 || strings.Count(out, "all 2 peers programmed as leased") != 3 || !strings.Contains(out, "device weft-u.1: TAP") {
		t.Fatalf("peers on mixed nodes: exit %d\n%s", code, out)
	}
	checkHostileLeaseRejected(t, bin, dir, st2)
	src, dst := st2.Pods[2], st2.Pods[0] // node2-pod1 (uvxlan, with the fast path by default) → node1-pod1 (vxlan)
	out, code = run(t, bin, "explain", "--lab", "--state-dir", dir, src.IP.String(), dst.IP.String())
	want := fmt.Sprintf("weft-u.1 is a TAP: weftd looks up %s in its own table → %s", vtepMAC(t, st2, 0), st2.Nodes[0].Addr)
	if code != 0 || !strings.Contains(out, want) || !strings.Contains(out, "the fast path wraps the frame") {
		t.Fatalf("explain from a uvxlan node: exit %d, want %q:\n%s", code, want, out)
	}
	second.cmd.Process.Signal(syscall.SIGINT)
	if err := second.wait(t, 40*time.Second); err != nil {
		t.Errorf("lab up after SIGINT: %v:\n%s", err, second.out.String())
	}
	assertGone(t, dir, st2)
	assertGone(t, dir, st1)
}

// pingAll pings every pod from every other pod with iputils' ping, inside
// the pod namespaces: an end-to-end check independent of the lab's own.
func pingAll(t *testing.T, st *State) {
	for _, src := range st.Pods {
		for _, dst := range st.Pods {
			if src.Name == dst.Name {
				continue
			}
			ipIn(t, src.NS, "ping", "-c", "1", "-W", "2", dst.IP.String())
		}
	}
}

// checkHostileLeaseRejected writes a route-hijacking lease into the lab's
// etcd: `weftctl peers --lab` must show it as rejected on every node, as
// weftd rejects it, and still find every real peer programmed.
func checkHostileLeaseRejected(t *testing.T, bin, dir string, st *State) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{st.Etcd}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key := st.EtcdPfx + "/subnets/0.0.0.0-1"
	value := `{"PublicIP":"192.0.2.66","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"02:00:00:00:00:66"}}`
	if _, err := cli.Put(ctx, key, value); err != nil {
		t.Fatal(err)
	}
	defer cli.Delete(context.Background(), key)
	out, code := run(t, bin, "peers", "--lab", "--state-dir", dir)
	if code != 0 || strings.Count(out, "all 2 peers programmed as leased") != 3 || strings.Count(out, "rejected lease 0.0.0.0-1 (node 192.0.2.66)") != 3 {
		t.Fatalf("peers with a hostile lease in etcd: exit %d\n%s", code, out)
	}
}

func checkLeases(t *testing.T, bin, dir string, st *State) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{st.Etcd}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, st.EtcdPfx+"/subnets/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != len(st.Nodes) {
		t.Fatalf("%d leases in etcd for %d nodes", len(resp.Kvs), len(st.Nodes))
	}
	out, code := run(t, bin, "leases", "--lab", "--state-dir", dir)
	if code != 0 {
		t.Fatalf("leases: exit %d\n%s", code, out)
	}
	for _, kv := range resp.Kvs {
		v4, _, err := subnet.ParseKey(strings.TrimPrefix(string(kv.Key), st.EtcdPfx+"/subnets/"))
		if err != nil {
			t.Fatal(err)
		}
		var a subnet.LeaseAttrs
		if err := a.UnmarshalJSON(kv.Value); err != nil {
			t.Fatal(err)
		}
		ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		if err != nil || ttl.TTL <= 0 {
			t.Fatalf("ttl of %s: %v %v", kv.Key, ttl, err)
		}
		line := regexp.MustCompile(regexp.QuoteMeta(v4.String()) + `\s+` + regexp.QuoteMeta(a.PublicIP.String()) + `\s+` +
			regexp.QuoteMeta(a.BackendData.VtepMAC.String()) + `\s+vxlan\s+(\d+)h(\d+)m`)
		m := line.FindStringSubmatch(out)
		if m == nil {
			t.Errorf("no line for %s at %s with MAC %s in:\n%s", v4, a.PublicIP, a.BackendData.VtepMAC, out)
			continue
		}
		h, _ := strconv.Atoi(m[1])
		if left := time.Duration(ttl.TTL) * time.Second; left.Hours() < float64(h) || left.Hours() > float64(h+1) {
			t.Errorf("%s: weftctl says %sh left, etcd %s", v4, m[1], left)
		}
	}
}

func checkPeers(t *testing.T, bin, dir string, st *State) {
	out, code := run(t, bin, "peers", "--lab", "--state-dir", dir)
	if code != 0 || strings.Count(out, "all 2 peers programmed as leased") != 3 {
		t.Fatalf("peers: exit %d\n%s", code, out)
	}
	// Freeze node1's weftd so it cannot repair, remove its route to node2's
	// subnet, and expect peers (run inside node1, as on a real node) to
	// report exactly that.
	n1, n2 := st.Nodes[0], st.Nodes[1]
	sub := subnetOf(t, st, n2)
	if err := syscall.Kill(n1.Weftd.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(n1.Weftd.PID, syscall.SIGCONT)
	ipIn(t, n1.NS, "ip", "route", "del", sub)
	out, code = run(t, bin, "lab", "exec", "--state-dir", dir, "node1", "--", bin, "peers")
	if code != 2 || !regexp.MustCompile(regexp.QuoteMeta(sub)+`\s.*missing: no route`).MatchString(out) {
		t.Fatalf("peers with a deleted route: exit %d\n%s", code, out)
	}
	syscall.Kill(n1.Weftd.PID, syscall.SIGCONT)
	for end := time.Now().Add(15 * time.Second); ; {
		out, code = run(t, bin, "peers", "--lab", "--state-dir", dir, "--node", "node1")
		if code == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("weftd did not repair the route within 15s:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// subnetOf returns the node's lease subnet, from its subnet file.
func subnetOf(t *testing.T, st *State, n NodeState) string {
	f, err := subnet.ReadFile(n.SubnetFile)
	if err != nil {
		t.Fatal(err)
	}
	return f.Subnet.Masked().String()
}

func checkExplain(t *testing.T, bin, dir string, st *State) {
	src, dst := st.Pods[0], st.Pods[len(st.Pods)-1] // node1-pod1 → node3-pod2
	n1, n3 := st.Nodes[0], st.Nodes[2]
	out, code := run(t, bin, "explain", "--lab", "--state-dir", dir, src.IP.String(), dst.IP.String())
	if code != 0 {
		t.Fatalf("explain: exit %d\n%s", code, out)
	}
	// What iproute2 says in node1, the source's node.
	get := strings.Fields(ipIn(t, n1.NS, "ip", "route", "get", dst.IP.String()))
	via, dev := after(get, "via"), after(get, "dev")
	neigh := strings.Fields(ipIn(t, n1.NS, "ip", "neigh", "show", via, "dev", dev))
	mac := after(neigh, "lladdr")
	var fdbDst string
	for _, l := range strings.Split(ipIn(t, n1.NS, iproute2Bridge(t), "fdb", "show", "dev", dev), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == mac {
			fdbDst = after(f, "dst")
		}
	}
	mtu := after(strings.Fields(ipIn(t, n1.NS, "ip", "link", "show", dev)), "mtu")
	wants := []string{
		fmt.Sprintf("route         %s via %s dev %s onlink", subnetOf(t, st, n3), via, dev),
		fmt.Sprintf("neighbour     %s lladdr %s PERMANENT", via, mac),
		fmt.Sprintf("fdb           %s dst %s self permanent", mac, fdbDst),
		fmt.Sprintf("underlay      %s → %s dev eth0 (on-link)", n1.Addr, n3.Addr),
		fmt.Sprintf("overlay %s MTU %s + 50 = 1500 ≤ underlay eth0 MTU 1500", dev, mtu),
		"UDP → port 8472, VXLAN VNI 1",
		"(read on node1)",
		fmt.Sprintf("admit         node %s takes VXLAN datagrams only from its peers' public addresses (kernel VXLAN: rule \"weft: vxlan from a non-peer\"", n3.Addr),
	}
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("explain lacks %q (from the kernel):\n%s", w, out)
		}
	}
	if fdbDst != n3.Addr.String() || dev != "weft.1" {
		t.Errorf("kernel: fdb dst %q dev %q; the lab's node3 is %s", fdbDst, dev, n3.Addr)
	}
	// Remove the FDB entry behind a frozen weftd: explain must point at it.
	if err := syscall.Kill(n1.Weftd.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(n1.Weftd.PID, syscall.SIGCONT)
	ipIn(t, n1.NS, iproute2Bridge(t), "fdb", "del", mac, "dev", dev, "dst", fdbDst)
	out, code = run(t, bin, "explain", "--lab", "--state-dir", dir, src.IP.String(), dst.IP.String())
	if code != 2 || !strings.Contains(out, "no FDB entry for "+mac) || !strings.Contains(out, "!! the kernel has nowhere to send") {
		t.Fatalf("explain without the FDB entry: exit %d\n%s", code, out)
	}
	syscall.Kill(n1.Weftd.PID, syscall.SIGCONT)
	for end := time.Now().Add(15 * time.Second); code != 0; {
		if time.Now().After(end) {
			t.Fatalf("weftd did not restore the FDB entry within 15s:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
		out, code = run(t, bin, "explain", "--lab", "--state-dir", dir, src.IP.String(), dst.IP.String())
	}
}

// after returns the field after key in fs ("" when absent).
func after(fs []string, key string) string {
	if i := slices.Index(fs, key); i >= 0 && i+1 < len(fs) {
		return fs[i+1]
	}
	return ""
}

// iproute2Bridge finds iproute2's bridge tool: PATH may hold the CNI
// bridge plugin under the same name.
func iproute2Bridge(t *testing.T) string {
	cands := []string{"/usr/sbin/bridge", "/sbin/bridge", "/usr/bin/bridge", "/bin/bridge"}
	if p, err := exec.LookPath("bridge"); err == nil {
		cands = append([]string{p}, cands...)
	}
	for _, c := range cands {
		if out, err := exec.Command(c, "-V").CombinedOutput(); err == nil && strings.Contains(string(out), "bridge utility") {
			return c
		}
	}
	t.Fatalf("iproute2's bridge tool not found in %v", cands)
	return ""
}

// vtepMAC returns node i's VTEP MAC as the kernel of node i shows it.
func vtepMAC(t *testing.T, st *State, i int) string {
	t.Helper()
	dev := "weft.1"
	if st.Nodes[i].Backend == "uvxlan" {
		dev = "weft-u.1"
	}
	return after(strings.Fields(ipIn(t, st.Nodes[i].NS, "ip", "link", "show", dev)), "link/ether")
}
