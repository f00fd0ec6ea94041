package flows

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-net/weft/flow"
)

func node(t *testing.T, name string) (Endpoint, *flow.Ring) {
	r := flow.NewRing(64, 1000, 1000)
	srv := httptest.NewServer(flow.Handler(name, r, nil))
	t.Cleanup(srv.Close)
	return Endpoint{Node: name, Client: srv.Client(), Base: srv.URL}, r
}

var (
	a = netip.MustParseAddr("10.244.1.2")
	b = netip.MustParseAddr("10.244.2.3")
)

// TestRecentMerges: two nodes' flows come back merged by time, filtered
// on the nodes (verdict) and here (the pods' namespace), named and
// printed with the policy of a drop and the counts of a close.
func TestRecentMerges(t *testing.T) {
	e1, r1 := node(t, "n1")
	e2, r2 := node(t, "n2")
	t0 := time.Now()
	r2.Add(flow.Flow{Time: t0.Add(2 * time.Second), Event: flow.EventDrop, Verdict: flow.Dropped, Proto: "tcp", Src: a, Dst: b, DstPort: 5432,
		Direction: flow.DirIngress, Policies: []string{"shop/db"}})
	r1.Add(flow.Flow{Time: t0, Event: flow.EventClose, Verdict: flow.Allowed, Proto: "tcp", Src: a, Dst: b, DstPort: 80,
		Counts: &flow.Counts{OrigBytes: 2048, OrigPackets: 3, ReplyBytes: 100, ReplyPackets: 2}})
	r1.Add(flow.Flow{Time: t0.Add(time.Second), Event: flow.EventNew, Verdict: flow.Allowed, Proto: "udp", Src: b, Dst: netip.MustParseAddr("10.244.9.9"), DstPort: 53})
	names := Names{a: "web/front", b: "shop/db-0"}
	got, gaps, errs := Recent(context.Background(), []Endpoint{e1, e2}, Query{}, names)
	if len(gaps) > 0 {
		t.Errorf("gaps where nothing is missing: %q", gaps)
	}
	if len(errs) > 0 || len(got) != 3 || got[0].Node != "n1" || got[1].Event != flow.EventNew || got[2].Node != "n2" {
		t.Fatalf("merged %+v, %v", got, errs)
	}
	var out bytes.Buffer
	for _, f := range got {
		Text(&out, f, names)
	}
	for _, want := range []string{"CLOSED  tcp    web/front(10.244.1.2) -> shop/db-0(10.244.2.3):80 sent 2.0 KiB/3 pkts, back 100 B/2 pkts",
		"DROPPED tcp    web/front(10.244.1.2) -> shop/db-0(10.244.2.3):5432 default deny (ingress): destination pod selected by shop/db; no rule allows"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	got, _, _ = Recent(context.Background(), []Endpoint{e1, e2}, Query{Filter: flow.Filter{Verdict: flow.Dropped}}, names)
	if len(got) != 1 || got[0].DstPort != 5432 {
		t.Errorf("dropped: %+v", got)
	}
	got, _, _ = Recent(context.Background(), []Endpoint{e1, e2}, Query{PodNamespace: "web"}, names)
	if len(got) != 2 {
		t.Errorf("namespace web: %+v", got)
	}
	bad := Endpoint{Node: "gone", Client: http.DefaultClient, Base: "http://127.0.0.1:1"}
	if _, _, errs := Recent(context.Background(), []Endpoint{e1, bad}, Query{}, names); len(errs) != 1 || !strings.Contains(errs[0].Error(), "node gone") {
		t.Errorf("a node that does not answer: %v", errs)
	}
}

// TestRecentGaps: what a node's flows lack (flows over the ring's rate,
// conntrack's pauses, overflowed sockets) comes back named by node.
func TestRecentGaps(t *testing.T) {
	r := flow.NewRing(64, 1, 1)
	r.Add(flow.Flow{Time: time.Now(), Event: flow.EventNew, Verdict: flow.Allowed, Src: a, Dst: b})
	r.Add(flow.Flow{Time: time.Now(), Event: flow.EventNew, Verdict: flow.Allowed, Src: a, Dst: b})
	srv := httptest.NewServer(flow.Handler("n3", r, func() flow.Readers {
		return flow.Readers{Lost: 2, ConntrackRate: 1000, ConntrackPauses: 3, ConntrackPausedSeconds: 2.25}
	}))
	t.Cleanup(srv.Close)
	e3 := Endpoint{Node: "n3", Client: srv.Client(), Base: srv.URL}
	e1, _ := node(t, "n1")
	got, gaps, errs := Recent(context.Background(), []Endpoint{e1, e3}, Query{}, nil)
	want := "n3: since weftd started, 1 flows over the ring's rate (1 a second) not kept; conntrack's events not read for 2.2 s in 3 pauses (over 1000 a second); events lost 2 times (a socket overflowed)"
	if len(got) != 1 || len(errs) > 0 || len(gaps) != 1 || gaps[0] != want {
		t.Errorf("flows %+v, errors %v, gaps %q; want %q", got, errs, gaps, want)
	}
}

// TestFollow: what a node holds comes first, then what it adds.
func TestFollow(t *testing.T) {
	e1, r1 := node(t, "n1")
	r1.Add(flow.Flow{Time: time.Now(), Event: flow.EventNew, Verdict: flow.Allowed, Src: a, Dst: b})
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var seen []flow.Flow
	done := make(chan struct{})
	go func() {
		defer close(done)
		Follow(ctx, []Endpoint{e1}, Query{}, nil, func(f flow.Flow) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, f)
			if len(seen) == 2 {
				cancel()
			}
		}, func(err error) { t.Error(err) })
	}()
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	r1.Add(flow.Flow{Time: time.Now(), Event: flow.EventDrop, Verdict: flow.Dropped, Src: a, Dst: b, Policies: []string{"x/y"}})
	<-done
	if seen[0].Event != flow.EventNew || seen[1].Event != flow.EventDrop || seen[1].Seq != 2 {
		t.Errorf("followed %+v", seen)
	}
}
