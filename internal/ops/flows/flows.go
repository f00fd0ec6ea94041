// Package flows reads the recent flows and policy verdicts that weftd
// serves on /flows of its health address, from one node or every node
// (weftctl flows), merges them by time and prints them as text or JSON.
// It asks the nodes for what they hold; the verdicts are the kernel's.
package flows

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/weft-net/weft/flow"
)

// Endpoint is one node's weftd: its name, and the client and base URL
// ("http://127.0.0.1:9470") that reach its health address.
type Endpoint struct {
	Node   string
	Client *http.Client
	Base   string
}

// Query is what to ask every node for. Pods are the addresses of the pods
// asked for (by name, resolved by the caller); PodNamespace keeps flows
// with an end in that namespace (by Names) or a deciding policy of it.
type Query struct {
	Filter       flow.Filter
	PodNamespace string
	Limit        int
}

func (q Query) values(since uint64, wait time.Duration) url.Values {
	v := url.Values{}
	f := q.Filter
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("verdict", f.Verdict)
	set("policy", f.Policy)
	if f.Port != 0 {
		v.Set("port", strconv.Itoa(int(f.Port)))
	}
	for _, a := range f.Addrs {
		v.Add("addr", a.String())
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if since > 0 {
		v.Set("since", strconv.FormatUint(since, 10))
	}
	if wait > 0 {
		v.Set("wait", strconv.FormatFloat(wait.Seconds(), 'f', -1, 64))
	}
	return v
}

// Fetch asks one node for its flows after since, waiting up to wait for
// one if there is none yet.
func Fetch(ctx context.Context, ep Endpoint, q Query, since uint64, wait time.Duration) (flow.Page, error) {
	var page flow.Page
	u := ep.Base + "/flows?" + q.values(since, wait).Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return page, err
	}
	resp, err := ep.Client.Do(req)
	if err != nil {
		return page, fmt.Errorf("node %s: %w", ep.Node, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if resp.StatusCode == http.StatusNotFound {
			return page, fmt.Errorf("node %s: weftd serves no /flows (started with --flows=false, or an older weftd)", ep.Node)
		}
		return page, fmt.Errorf("node %s: %s: %s", ep.Node, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&page); err != nil {
		return page, fmt.Errorf("node %s: %w", ep.Node, err)
	}
	for i := range page.Flows {
		page.Flows[i].Node = ep.Node
	}
	return page, nil
}

// Recent asks every node at once and returns their flows merged by time,
// the last q.Limit of them (0: all), what each node's flows lack
// ("node: …", see flow.Page.Gaps) and an error per node that did not
// answer.
func Recent(ctx context.Context, eps []Endpoint, q Query, names Names) ([]flow.Flow, []string, []error) {
	var mu sync.Mutex
	var all []flow.Flow
	var gaps []string
	var errs []error
	var wg sync.WaitGroup
	for _, ep := range eps {
		wg.Go(func() {
			page, err := Fetch(ctx, ep, q, 0, 0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			all = append(all, page.Flows...)
			if g := page.Gaps(); g != "" {
				gaps = append(gaps, ep.Node+": "+g)
			}
		})
	}
	wg.Wait()
	all = slices.DeleteFunc(all, func(f flow.Flow) bool { return !q.keep(f, names) })
	slices.SortStableFunc(all, func(a, b flow.Flow) int { return a.Time.Compare(b.Time) })
	if q.Limit > 0 && len(all) > q.Limit {
		all = all[len(all)-q.Limit:]
	}
	slices.Sort(gaps)
	return all, gaps, errs
}

// Follow prints (through emit, called from one goroutine at a time) every
// node's flows as they come, until ctx ends; a node that does not answer
// is reported through fail and asked again a second later.
func Follow(ctx context.Context, eps []Endpoint, q Query, names Names, emit func(flow.Flow), fail func(error)) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, ep := range eps {
		wg.Go(func() {
			var since uint64
			first := true
			for ctx.Err() == nil {
				wait := 10 * time.Second
				if first {
					wait = 0 // what the node holds already
				}
				page, err := Fetch(ctx, ep, q, since, wait)
				if err != nil {
					if ctx.Err() == nil {
						fail(err)
						sleep(ctx, time.Second)
					}
					continue
				}
				first, since = false, page.Next
				mu.Lock()
				for _, f := range page.Flows {
					if q.keep(f, names) {
						emit(f)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// keep applies what the nodes cannot: the pods' namespace.
func (q Query) keep(f flow.Flow, names Names) bool {
	if q.PodNamespace == "" {
		return true
	}
	in := func(a netip.Addr) bool { ns, _, _ := strings.Cut(names[a], "/"); return ns == q.PodNamespace }
	return in(f.Src) || in(f.Dst) || slices.ContainsFunc(f.Policies, func(p string) bool { return strings.HasPrefix(p, q.PodNamespace+"/") })
}
