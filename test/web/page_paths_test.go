package web

import (
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// The page's paths between pods, against `weftctl explain`.

// explainHop is one numbered line of `weftctl explain`.
var explainHop = regexp.MustCompile(`^\s*\d+\. (.{13}) (.*)$`)

// explain runs `weftctl explain --lab` and returns its hops as step, detail.
func (p *page) explain(t *testing.T, src, dst string) [][2]string {
	t.Helper()
	out, err := exec.Command(p.ctl, "explain", "--lab", "--state-dir", p.dir, src, dst).CombinedOutput()
	if err != nil {
		t.Fatalf("weftctl explain %s %s: %v\n%s", src, dst, err, out)
	}
	var hops [][2]string
	for _, line := range strings.Split(string(out), "\n") {
		if m := explainHop.FindStringSubmatch(line); m != nil {
			hops = append(hops, [2]string{strings.TrimSpace(m[1]), m[2]})
		}
	}
	if len(hops) < 3 {
		t.Fatalf("weftctl explain printed no hops:\n%s", out)
	}
	return hops
}

// showPath picks src and dst in the form and returns the path table.
func (p *page) showPath(t *testing.T, src, dst, outside string) [][]string {
	t.Helper()
	js := fmt.Sprintf(`(() => { document.getElementById('path-table').hidden = true;
		const s = document.getElementById('path-src'), d = document.getElementById('path-dst');
		s.value = %q; d.value = %q; d.dispatchEvent(new Event('change'));
		document.getElementById('path-outside').value = %q;
		document.querySelector('#path-form button').click(); return s.value === %q && d.value === %q; })()`, src, dst, outside, src, dst)
	if !eval[bool](t, p.ctx, js) {
		t.Fatalf("the form offers no %s → %s", src, dst)
	}
	waitFor(t, p.ctx, "the path table", `!document.getElementById('path-table').hidden`, 10*time.Second)
	return rows(t, p.ctx, "#path-table")
}

// checkPaths compares the page's hops with explain's for a kernel → uvxlan
// pair, a uvxlan → kernel pair and a pod → outside address, and checks
// the pod ends around them.
func (p *page) checkPaths(t *testing.T) {
	cases := []struct{ src, dst, outside, middle string }{
		{"node1-pod1", "node2-pod2", "", "fdb"},
		{"node2-pod1", "node3-pod2", "", "vtep table"},
		{"node3-pod1", "outside", "192.0.2.10", "masquerade"},
	}
	for _, c := range cases {
		src := p.pods[c.src].IP.String()
		dst, dstAddr := "outside", c.outside
		if c.dst != "outside" {
			dst = p.pods[c.dst].IP.String()
			dstAddr = dst
		}
		want := p.explain(t, src, dstAddr)
		got := p.showPath(t, src, dst, c.outside)
		var explained [][]string
		for _, r := range got {
			if r[1] != "pod eth0" && r[1] != "veth" && r[1] != "bridge" {
				explained = append(explained, r)
			}
		}
		if len(explained) != len(want) {
			t.Errorf("%s → %s: the page shows %d of explain's hops, explain prints %d:\npage %q\nexplain %q", c.src, c.dst, len(explained), len(want), got, want)
			continue
		}
		for i, w := range want {
			if explained[i][1] != w[0] || !strings.HasPrefix(explained[i][3], w[1]) || explained[i][2] == "" {
				t.Errorf("%s → %s hop %d: page %q, explain %q", c.src, c.dst, i+1, explained[i], w)
			}
		}
		if !slices.ContainsFunc(explained, func(r []string) bool { return r[1] == c.middle }) {
			t.Errorf("%s → %s: no %q hop: %q", c.src, c.dst, c.middle, got)
		}
		p.checkPodEnds(t, c.src, c.dst, got)
	}
}

// checkPodEnds checks the pod eth0 → veth → bridge hops at each pod end,
// naming the veth the lab's kernel holds.
func (p *page) checkPodEnds(t *testing.T, src, dst string, got [][]string) {
	steps := []string{}
	for _, r := range got {
		steps = append(steps, r[1])
	}
	if !slices.Equal(steps[:3], []string{"pod eth0", "veth", "bridge"}) {
		t.Errorf("%s → %s starts %q, want pod eth0, veth, bridge", src, dst, steps)
	}
	veth := p.hostVeth(t, src)
	if !contains(got[1][2], veth) || !contains(got[2][2], "bridge cni0 on "+p.pods[src].Node) {
		t.Errorf("%s's end: %q, want veth %s on bridge cni0", src, got[:3], veth)
	}
	if dst == "outside" {
		return
	}
	n := len(steps)
	if steps[n-1] == "return" { // the way back, drawn after the destination (uvxlan's fast path)
		n--
	}
	if !slices.Equal(steps[n-3:n], []string{"bridge", "veth", "pod eth0"}) {
		t.Errorf("%s → %s ends %q, want bridge, veth, pod eth0", src, dst, steps)
	}
	if veth := p.hostVeth(t, dst); !contains(got[n-2][2], veth) || !contains(got[n-1][2], "pod "+dst) {
		t.Errorf("%s's end: %q, want veth %s", dst, got[n-3:n], veth)
	}
}

// hostVeth asks the node's kernel which veth is the pod's other end.
func (p *page) hostVeth(t *testing.T, pod string) string {
	t.Helper()
	ps := p.pods[pod]
	out, err := exec.Command("ip", "netns", "exec", ps.NS, "ip", "-o", "link", "show", "eth0").Output()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`eth0@if(\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("eth0 of %s: %s", pod, out)
	}
	n, _ := p.lab.State.Node(ps.Node)
	out, err = exec.Command("ip", "netns", "exec", n.NS, "ip", "-o", "link").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, m[1]+": ") {
			return strings.SplitN(strings.Fields(l)[1], "@", 2)[0]
		}
	}
	t.Fatalf("no link %s on %s", m[1], ps.Node)
	return ""
}
