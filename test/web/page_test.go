package web

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/internal/ops/lab"
	"github.com/weft-net/weft/internal/ops/web"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/testlog"
	"github.com/weft-net/weft/subnet"
)

// page is a lab and the page of it, open in a browser.
type page struct {
	lab  *lab.Lab
	dir  string
	url  string
	ctx  context.Context
	ctl  string // weftctl, for explain
	pods map[string]lab.PodState
}

// openPage starts a three-node lab (node2 uvxlan), serves its page on the
// loopback of the browser's namespace and opens it in Chromium there at
// width×height. The server itself runs in the test process: it reads etcd
// over the lab's unix socket and each node through sockets and netlink
// handles made inside the node's namespace.
func openPage(t *testing.T, width, height int) *page {
	t.Helper()
	nettest.RequireRoot(t)
	ctx, bns := browser(t, width, height) // first: a missing chromium fails before the lab is built
	p := &page{dir: filepath.Join(t.TempDir(), "lab"), ctx: ctx, ctl: nettest.Binary(t, "weftctl"), pods: map[string]lab.PodState{}}
	o := lab.Options{StateDir: p.dir, Nodes: 3, PodsPerNode: 2, Backend: lab.BackendMixed, Weftd: nettest.Binary(t, "weftd")}
	o.CNIBin = filepath.Dir(nettest.Binary(t, "weft"))
	l, err := lab.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("close the lab: %v", err)
		}
	})
	p.lab = l
	for _, pod := range l.State.Pods {
		p.pods[pod.Name] = pod
	}
	leases := func(ctx context.Context) ([]subnet.Lease, *subnet.Config, error) {
		cfg, err := inspect.EtcdConfig(ctx, l.Client(), l.State.EtcdPfx)
		if err != nil {
			return nil, nil, err
		}
		ls, _, err := inspect.EtcdLeases(ctx, l.Client(), l.State.EtcdPfx)
		return inspect.Leases(ls), cfg, err
	}
	srv := &web.Server{Source: &web.LabSource{Dir: p.dir, Leases: leases, Source: "etcd"}, Interval: 500 * time.Millisecond}
	ln, err := bns.Listen("tcp", "127.0.0.1:0") // the browser's loopback, not the machine's
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(sctx, ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("web server: %v", err)
		}
	})
	p.url = "http://" + ln.Addr().String() + "/"
	if err := chromedp.Do(ctx, chromedp.Navigate(p.url)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the first snapshot", `document.querySelectorAll('#nodes-layer [data-node]').length === 3`, 10*time.Second)
	return p
}

// TestPageShowsTheLab opens the page of a three-node lab and checks what a
// person sees, then writes the screenshots when asked.
func TestPageShowsTheLab(t *testing.T) {
	p := openPage(t, 1280, 800)
	t.Run("every node, pod and link", p.checkLayout)
	t.Run("rates rise while a ping runs", p.checkRates)
	t.Run("a deleted lease goes within 2s", p.checkLeaseDeleted)
	t.Run("a rejected lease", p.checkRejected)
	t.Run("a drift repair", p.checkRepair)
	t.Run("paths match weftctl explain", p.checkPaths)
	t.Run("content security policy holds in the browser", p.checkCSP)
	t.Run("phone width", p.checkPhone)
	t.Run("weftctl web on a node", p.checkOnNode)
	t.Run("screenshots", p.screenshots)
}

func (p *page) checkLayout(t *testing.T) {
	ctx := p.ctx
	for _, n := range p.lab.State.Nodes {
		sel := fmt.Sprintf(`[data-node=%q]`, n.Name)
		if !eval[bool](t, ctx, fmt.Sprintf(`!!document.querySelector('#nodes-layer %s')`, sel)) {
			t.Errorf("node %s not drawn", n.Name)
		}
		if got := eval[string](t, ctx, fmt.Sprintf(`document.querySelector('#nodes-layer %s').textContent`, sel)); !contains(got, n.Addr.String()) {
			t.Errorf("node %s drawn as %q: no underlay address %s", n.Name, got, n.Addr)
		}
	}
	for _, pod := range p.lab.State.Pods {
		got := eval[string](t, ctx, fmt.Sprintf(`(document.querySelector('#nodes-layer [data-node=%q] [data-pod=%q]') || {}).textContent || ''`, pod.Node, pod.Name))
		if !contains(got, pod.Name, pod.IP.String(), "veth") {
			t.Errorf("pod %s drawn in %s as %q, want its name, address %s and host veth", pod.Name, pod.Node, got, pod.IP)
		}
	}
	ls, _, err := inspect.EtcdLeases(context.Background(), p.lab.Client(), p.lab.State.EtcdPfx)
	if err != nil {
		t.Fatal(err)
	}
	nodeRows := rows(t, ctx, "#nodes-table")
	for _, n := range p.lab.State.Nodes {
		l := leaseOf(t, inspect.Leases(ls), n.Addr.String())
		i := slices.IndexFunc(nodeRows, func(r []string) bool { return r[0] == n.Name })
		if i < 0 {
			t.Errorf("no row for %s in the nodes table: %v", n.Name, nodeRows)
			continue
		}
		want := []string{n.Addr.String(), l.Subnet.String(), l.Attrs.BackendData.VtepMAC.String(), "✓ ready"}
		dataplane := map[string]string{lab.BackendVXLAN: "kernel VXLAN device weft.1", lab.BackendUVXLAN: "uvxlan) on TAP weft-u.1"}[n.Backend]
		if row := strings.Join(nodeRows[i], " | "); !contains(row, append(want, dataplane)...) {
			t.Errorf("row of %s: %s\nwant %q and %q", n.Name, row, want, dataplane)
		}
	}
	linkRows := rows(t, ctx, "#links-table")
	for _, pair := range [][2]string{{"node1", "node2"}, {"node1", "node3"}, {"node2", "node3"}} {
		drawn := eval[bool](t, ctx, fmt.Sprintf(`!!document.querySelector('#links-layer [data-link=%q], #links-layer [data-link=%q]')`, pair[0]+"--"+pair[1], pair[1]+"--"+pair[0]))
		i := slices.IndexFunc(linkRows, func(r []string) bool {
			return r[0] == pair[0]+" ↔ "+pair[1] || r[0] == pair[1]+" ↔ "+pair[0]
		})
		if !drawn || i < 0 {
			t.Errorf("link %s–%s: drawn %t, in the table %t", pair[0], pair[1], drawn, i >= 0)
			continue
		}
		if st := linkRows[i][2]; !strings.HasPrefix(st, "✓") || strings.Count(st, ": ok") != 2 {
			t.Errorf("link %s–%s state %q: want both ends ok", pair[0], pair[1], st)
		}
	}
	if d := eval[string](t, ctx, `document.getElementById('svg-desc').textContent`); !contains(d, "3 nodes and 3 links", "node2-pod2") {
		t.Errorf("the drawing's text alternative: %q", d)
	}
}

func leaseOf(t *testing.T, ls []subnet.Lease, addr string) subnet.Lease {
	t.Helper()
	for _, l := range ls {
		if l.Attrs.PublicIP.String() == addr {
			return l
		}
	}
	t.Fatalf("no lease of %s", addr)
	return subnet.Lease{}
}

// frames returns the page's frame rates (out, in) of a node's overlay.
func (p *page) frames(t *testing.T, node string) (float64, float64) {
	t.Helper()
	s := eval[string](t, p.ctx, fmt.Sprintf(`document.querySelector('[data-frames=%q]').textContent`, node))
	f := strings.Split(s, ", ")
	if len(f) != 2 {
		return -1, -1
	}
	out, err1 := strconv.ParseFloat(strings.TrimSpace(f[0]), 64)
	in, err2 := strconv.ParseFloat(strings.TrimSpace(f[1]), 64)
	if err1 != nil || err2 != nil {
		return -1, -1
	}
	return out, in
}

// checkRates pings from a kernel-VXLAN node's pod to the uvxlan node's
// pod (20 a second) and waits for both nodes' rates to show it.
func (p *page) checkRates(t *testing.T) {
	src, dst := p.pods["node1-pod1"], p.pods["node2-pod1"]
	waitFor(t, p.ctx, "rates shown", `/^[0-9.]+, [0-9.]+$/.test(document.querySelector('[data-frames="node1"]').textContent)`, 5*time.Second)
	for _, n := range []string{"node1", "node2"} {
		if out, in := p.frames(t, n); out > 5 || in > 5 {
			t.Fatalf("%s shows %g/%g frames/s before any traffic", n, out, in)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ping := exec.CommandContext(ctx, "ip", "netns", "exec", src.NS, "ping", "-q", "-i", "0.05", "-w", "20", dst.IP.String())
	if err := ping.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); ping.Wait() }()
	deadline := time.Now().Add(8 * time.Second)
	for {
		o1, i1 := p.frames(t, "node1")
		o2, i2 := p.frames(t, "node2")
		if o1 >= 10 && i1 >= 10 && o2 >= 10 && i2 >= 10 {
			t.Logf("frames/s while pinging: node1 %g out %g in, node2 %g out %g in", o1, i1, o2, i2)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rates while pinging %s → %s at 20/s: node1 %g/%g, node2 %g/%g frames/s\n%v", src.Name, dst.Name, o1, i1, o2, i2, rows(t, p.ctx, "#nodes-table"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if b := eval[string](t, p.ctx, `document.querySelector('[data-bytes="node2"]').textContent`); !regexp.MustCompile(`^[1-9][0-9.]* ?k?, [1-9]`).MatchString(b) {
		t.Errorf("node2's byte rates while pinging: %q", b)
	}
	drawn := eval[string](t, p.ctx, `document.querySelector('#nodes-layer [data-rate="node2"]').textContent`)
	if !regexp.MustCompile(`^out [1-9][0-9.]* · in [1-9][0-9.]* frames/s$`).MatchString(drawn) {
		t.Errorf("node2's rates in the drawing while pinging: %q", drawn)
	}
	if r := rows(t, p.ctx, "#links-table"); !slices.ContainsFunc(r, func(c []string) bool {
		return regexp.MustCompile(`^node[12] [1-9][0-9.]*, node[12] [1-9][0-9.]*$`).MatchString(c[3])
	}) {
		t.Errorf("no link shows both ends' rates while node1 and node2 exchange frames: %q", r)
	}
}

// putLease writes a lease as a node's weftd would.
func (p *page) putLease(t *testing.T, key, publicIP, mac string) {
	t.Helper()
	v := fmt.Sprintf(`{"PublicIP":%q,"PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":%q}}`, publicIP, mac)
	if _, err := p.lab.Client().Put(context.Background(), p.lab.State.EtcdPfx+"/subnets/"+key, v); err != nil {
		t.Fatal(err)
	}
}

func (p *page) deleteLease(t *testing.T, key string) {
	t.Helper()
	if _, err := p.lab.Client().Delete(context.Background(), p.lab.State.EtcdPfx+"/subnets/"+key); err != nil {
		t.Fatal(err)
	}
}

// checkLeaseDeleted adds a fourth node's lease, waits for the page to draw
// it, deletes it in etcd and times how long the page takes to drop it.
func (p *page) checkLeaseDeleted(t *testing.T) {
	const key, addr = "10.244.250.0-24", "192.168.77.200"
	p.putLease(t, key, addr, "aa:bb:cc:00:02:50")
	waitFor(t, p.ctx, "the new lease drawn", `!!document.querySelector('#nodes-layer [data-node="192.168.77.200"]')`, 5*time.Second)
	waitFor(t, p.ctx, "its links", `document.querySelectorAll('#links-layer [data-link]').length === 6`, 3*time.Second)
	p.deleteLease(t, key)
	took := waitFor(t, p.ctx, "the deleted lease gone", `!document.querySelector('[data-node="192.168.77.200"]') && !document.querySelector('[data-node-row="192.168.77.200"]')`, 2*time.Second)
	t.Logf("a deleted lease left the page after %s", took.Round(10*time.Millisecond))
	if ev := eval[string](t, p.ctx, `document.getElementById('events').textContent`); !contains(ev, "lease 10.244.250.0/24 of 192.168.77.200 (192.168.77.200) appeared", "lease 10.244.250.0/24 of 192.168.77.200 (192.168.77.200) is gone") {
		t.Errorf("events: %q", ev)
	}
}

// checkRejected writes a lease with the wrong prefix length: the page lists
// it as rejected, draws no link to it, and logs weftd's rejections.
func (p *page) checkRejected(t *testing.T) {
	const key = "10.244.251.0-26"
	p.putLease(t, key, "192.168.77.201", "aa:bb:cc:00:02:51")
	defer p.deleteLease(t, key)
	waitFor(t, p.ctx, "the rejected lease listed", `document.querySelector('#rejected-table tbody').textContent.includes('10.244.251.0-26')`, 3*time.Second)
	r := rows(t, p.ctx, "#rejected-table")
	if len(r) != 1 || !contains(r[0][1], "prefix length 26") {
		t.Errorf("rejected table: %v", r)
	}
	waitFor(t, p.ctx, "weftd's rejections logged", `document.getElementById('events').textContent.includes('weftd rejected')`, 3*time.Second)
	if n := eval[int](t, p.ctx, `document.querySelectorAll('#links-layer [data-link]').length`); n != 3 {
		t.Errorf("%d links drawn with a rejected lease, want 3", n)
	}
	if s := eval[string](t, p.ctx, `document.querySelector('#nodes-layer [data-node="192.168.77.201"] text.name').textContent`); !strings.HasPrefix(s, "⊘") {
		t.Errorf("rejected lease drawn as %q, want it marked ⊘", s)
	}
}

// checkRepair deletes node1's route to node3's subnet by hand: weftd
// puts it back and the page logs the repair and counts it.
func (p *page) checkRepair(t *testing.T) {
	ls, _, err := inspect.EtcdLeases(context.Background(), p.lab.Client(), p.lab.State.EtcdPfx)
	if err != nil {
		t.Fatal(err)
	}
	n1, _ := p.lab.State.Node("node1")
	n3, _ := p.lab.State.Node("node3")
	sub := leaseOf(t, inspect.Leases(ls), n3.Addr.String()).Subnet.String()
	before := eval[string](t, p.ctx, `document.querySelector('[data-repairs="node1"]').textContent`)
	if out, err := exec.Command("ip", "netns", "exec", n1.NS, "ip", "route", "del", sub).CombinedOutput(); err != nil {
		t.Fatalf("ip route del %s on node1: %v\n%s", sub, err, out)
	}
	waitFor(t, p.ctx, "the repair logged", `document.getElementById('events').textContent.includes('repair: node1: weftd repaired 1 × route')`, 3*time.Second)
	after := eval[string](t, p.ctx, `document.querySelector('[data-repairs="node1"]').textContent`)
	if !strings.Contains(after, "route ") || after == before {
		t.Errorf("node1's repairs: %q before, %q after", before, after)
	}
}

// checkCSP: the browser refuses an inline script the page did not ship,
// and the page itself uses none (nor inline styles).
func (p *page) checkCSP(t *testing.T) {
	if s := eval[string](t, p.ctx, `[...document.querySelectorAll('script:not([src]), style, [style]')].map(e => e.outerHTML.slice(0, 200)).join('\n')`); s != "" {
		t.Errorf("inline scripts or styles in the page:\n%s", s)
	}
	ran := eval[bool](t, p.ctx, `(() => { const s = document.createElement('script'); s.textContent = 'window.injected = true'; document.body.append(s); s.remove(); return window.injected === true; })()`)
	if ran {
		t.Error("an inline script ran: the Content-Security-Policy does not hold")
	}
}

// checkPhone narrows the page to 390 px: nothing wider than the screen
// but the tables' own scroll boxes, the drawing scaled to fit.
func (p *page) checkPhone(t *testing.T) {
	if err := chromedp.Do(p.ctx, chromedp.EmulateViewport(390, 844)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if w := eval[int](t, p.ctx, `document.documentElement.scrollWidth`); w > 390 {
		t.Errorf("at 390 px the page is %d px wide", w)
	}
	if w := eval[float64](t, p.ctx, `document.getElementById('drawing').getBoundingClientRect().width`); w > 390 || w < 300 {
		t.Errorf("at 390 px the drawing is %g px wide", w)
	}
}

// screenshots writes docs/web-1280.png and docs/web-phone.png while a
// ping runs and a path is chosen, when WEFT_WEB_SCREENSHOTS is set.
func (p *page) screenshots(t *testing.T) {
	if os.Getenv("WEFT_WEB_SCREENSHOTS") == "" {
		return // an output on request, not a check
	}
	if err := chromedp.Do(p.ctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatal(err)
	}
	src, dst := p.pods["node1-pod1"], p.pods["node3-pod2"]
	ctx, cancel := context.WithCancel(context.Background())
	ping := exec.CommandContext(ctx, "ip", "netns", "exec", src.NS, "ping", "-q", "-i", "0.1", "-w", "30", dst.IP.String())
	if err := ping.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); ping.Wait() }()
	p.showPath(t, src.IP.String(), dst.IP.String(), "")
	time.Sleep(2 * time.Second)
	screenshot(t, p.ctx, "web-1280.png", 1280, 800, false)
	screenshot(t, p.ctx, "web-phone.png", 390, 844, false)
}

// checkOnNode runs `weftctl web` inside node1's namespace as on a real
// node (etcd flags, no --lab) and reads its snapshot and a path there:
// node1 observed through its own kernel and weftd, the others drawn from
// their leases, the path read on node1 as explain reads it.
func (p *page) checkOnNode(t *testing.T) {
	n1, _ := p.lab.State.Node("node1")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", n1.NS, p.ctl, "web", "--etcd-endpoints", p.lab.State.Etcd,
		"--etcd-prefix", p.lab.State.EtcdPfx, "--listen", "127.0.0.1:0", "--node-name", "node1")
	out := &testlog.Buffer{} // written by exec's copying goroutine as it is read here
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); cmd.Wait() }()
	serving := regexp.MustCompile(`serving (http://127\.0\.0\.1:\d+/)`)
	deadline := time.Now().Add(10 * time.Second)
	for !serving.MatchString(out.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("weftctl web in node1 does not serve:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	url := serving.FindStringSubmatch(out.String())[1]
	ns, err := lab.OpenNS(n1.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Handle.Close()
	var snap web.Snapshot
	getJSON(t, ns, url+"api/snapshot", &snap)
	if len(snap.Nodes) != 3 || snap.Source != "etcd" {
		t.Fatalf("snapshot on node1: %+v", snap)
	}
	for _, n := range snap.Nodes {
		switch {
		case n.Underlay == n1.Addr.String():
			if n.Name != "node1" || !n.Observed || n.Counters == nil || !n.Counters.Ready || len(n.Peers) != 2 || n.Error != "" {
				t.Errorf("node1 seen from itself: %+v", n)
			}
			for _, peer := range n.Peers {
				if peer.Verdict != inspect.OK {
					t.Errorf("node1's peer %s: %s", peer.Subnet, peer.Verdict)
				}
			}
		case n.Observed || n.Name != n.Underlay:
			t.Errorf("node %s (%s) observed from node1: %+v", n.Name, n.Underlay, n)
		}
	}
	if raw := fetch(t, ns, url+"api/snapshot"); strings.Contains(raw, p.lab.State.Etcd) {
		t.Errorf("the snapshot names the etcd endpoint %s", p.lab.State.Etcd)
	}
	var path web.PathView
	src, dst := p.pods["node1-pod1"].IP.String(), p.pods["node3-pod1"].IP.String()
	getJSON(t, ns, url+"api/path?src="+src+"&dst="+dst, &path)
	want := p.explain(t, src, dst)
	if path.ReadOn != "node1" || len(path.Hops) != len(want) || path.Problems != 0 {
		t.Fatalf("path %s → %s read on node1: %+v\nexplain: %q", src, dst, path, want)
	}
	for i, w := range want {
		if h := path.Hops[i]; h.Step != w[0] || h.Detail != w[1] {
			t.Errorf("hop %d: %q %q, explain %q", i+1, h.Step, h.Detail, w)
		}
	}
}

func fetch(t *testing.T, ns *namespace.NS, url string) string {
	t.Helper()
	code, body, err := ns.HTTPGet(url)
	if err != nil || code != 200 {
		t.Fatalf("GET %s in %s: %d %v\n%s", url, ns.Name, code, err, body)
	}
	return body
}

func getJSON(t *testing.T, ns *namespace.NS, url string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(fetch(t, ns, url)), v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
