package policy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// fakeAPI is an API server with no objects: lists answer empty (or fail
// for the resources in broken), watches wait until the client leaves.
func fakeAPI(t *testing.T, broken ...string) *rest.Config {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, b := range broken {
			if strings.HasSuffix(r.URL.Path, "/"+b) {
				http.Error(w, "no", http.StatusInternalServerError)
				return
			}
		}
		kind := map[string]string{"pods": "Pod", "namespaces": "Namespace", "networkpolicies": "NetworkPolicy"}
		name := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
		apiVersion := "v1"
		if name == "networkpolicies" {
			apiVersion = "networking.k8s.io/v1"
		}
		if r.URL.Query().Get("watch") == "true" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			if r.URL.Query().Get("sendInitialEvents") == "true" { // client-go's watch-list: no objects, then the end mark
				io.WriteString(w, `{"type":"BOOKMARK","object":{"kind":"`+kind[name]+`","apiVersion":"`+apiVersion+
					`","metadata":{"resourceVersion":"1","annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n")
			}
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"kind":"`+kind[name]+`List","apiVersion":"`+apiVersion+`","metadata":{"resourceVersion":"1"},"items":[]}`)
	}))
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL}
}

// reports records the controller's reports.
type reports struct {
	mu  sync.Mutex
	at  []time.Time
	err []error
	src []error // SourceChecks
}

func (r *reports) Programmed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at, r.err = append(r.at, time.Now()), append(r.err, err)
}

func (r *reports) SourceChecks(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.src = append(r.src, err)
}

func (r *reports) get() ([]time.Time, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time{}, r.at...), append([]error{}, r.err...)
}

func runController(t *testing.T, cfg Config) {
	c, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// TestFailedTransactionRetried: a transaction that fails is reported
// and retried with growing waits, without waiting for a change or the
// resync, until it commits; then the success is reported.
func TestFailedTransactionRetried(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	rep := &reports{}
	runController(t, Config{Client: fakeAPI(t), Subnet: netip.MustParsePrefix("10.244.1.0/24"), Resync: time.Hour, Reporter: rep,
		MaxBackoff: time.Second, Program: func(ps ...Plan) error {
			mu.Lock()
			defer mu.Unlock()
			calls++
			if calls <= 4 {
				return errors.New("transaction refused")
			}
			return nil
		}})
	deadline := time.Now().Add(10 * time.Second)
	for {
		at, errs := rep.get()
		if len(errs) >= 5 {
			for i, err := range errs[:4] {
				if err == nil {
					t.Errorf("report %d: nil, want the failure", i)
				}
			}
			if errs[4] != nil {
				t.Errorf("report 4: %v, want nil (committed)", errs[4])
			}
			if first, last := at[1].Sub(at[0]), at[4].Sub(at[3]); last < first || last < 400*time.Millisecond {
				t.Errorf("waits between attempts %s then %s: no backoff", first, last)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s, %d reports: %v (no retry without a change?)", len(errs), errs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestNothingBeforeSync: while an informer cannot list (here the
// namespaces), nothing is programmed and nothing reported, so weftd stays
// not ready rather than enforce a partial view.
func TestNothingBeforeSync(t *testing.T) {
	rep := &reports{}
	programmed := make(chan struct{}, 1)
	runController(t, Config{Client: fakeAPI(t, "namespaces"), Subnet: netip.MustParsePrefix("10.244.1.0/24"), Reporter: rep,
		Program: func(...Plan) error {
			select {
			case programmed <- struct{}{}:
			default:
			}
			return nil
		}})
	select {
	case <-programmed:
		t.Error("programmed before the namespaces were listed")
	case <-time.After(2 * time.Second):
	}
	if _, errs := rep.get(); len(errs) != 0 {
		t.Errorf("reports before sync: %v", errs)
	}
}

// TestProgramsAfterSync is the control of TestNothingBeforeSync: with
// every list answering, the first transaction comes at once, with the
// bridge ports of the address store's IPv6 addresses in the IPv6 plan.
func TestProgramsAfterSync(t *testing.T) {
	rep := &reports{}
	store := t.TempDir()
	for name, content := range map[string]string{"10.244.1.2": "c1\r\neth0", "fd00:1::5": "c2\r\neth0"} {
		if err := os.WriteFile(filepath.Join(store, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	runController(t, Config{Client: fakeAPI(t), IPv6Subnet: netip.MustParsePrefix("fd00:1::/64"), Reporter: rep, AddressStore: store,
		Program: func(ps ...Plan) error {
			if len(ps) != 1 || !ps[0].V6 {
				return errors.New("want one IPv6 plan")
			}
			if want := []PodPort{{ip("fd00:1::5"), "veth50d33405d10"}}; !reflect.DeepEqual(ps[0].Ports, want) {
				return fmt.Errorf("ports %v, want %v", ps[0].Ports, want)
			}
			return nil
		}})
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, errs := rep.get(); len(errs) > 0 {
			if errs[0] != nil {
				t.Error(errs[0])
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing programmed in 5s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSourceChecksReported: a transaction whose bridge table the kernel
// refused (ErrNoSourceChecks) counts as committed, and the reporter hears
// that the source checks are off; so it does when the address store
// cannot be read; and that they are on again once both are fine.
func TestSourceChecksReported(t *testing.T) {
	rep := &reports{}
	store := filepath.Join(t.TempDir(), "store")
	var refuse atomic.Bool
	refuse.Store(true)
	cfg := Config{Client: fakeAPI(t), Subnet: netip.MustParsePrefix("10.244.1.0/24"), Reporter: rep, AddressStore: store,
		Resync: 50 * time.Millisecond,
		Program: func(...Plan) error {
			if refuse.Load() {
				return fmt.Errorf("%w: operation not supported", ErrNoSourceChecks)
			}
			return nil
		}}
	runController(t, cfg)
	last := func() (prog, src error, n int) {
		rep.mu.Lock()
		defer rep.mu.Unlock()
		if len(rep.src) == 0 {
			return nil, nil, 0
		}
		return rep.err[len(rep.err)-1], rep.src[len(rep.src)-1], len(rep.src)
	}
	waitUntil := func(what string, ok func(prog, src error, n int) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !ok(last()) {
			if time.Now().After(deadline) {
				prog, src, n := last()
				t.Fatalf("%s: last reports Programmed(%v), SourceChecks(%v) of %d", what, prog, src, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitUntil("bridge table refused", func(prog, src error, n int) bool {
		return n > 0 && prog == nil && errors.Is(src, ErrNoSourceChecks)
	})
	// A file where the store should be: it cannot be read. (A store that
	// does not exist on a node without pods is none of the checks'
	// problems: TestStoreProblem.)
	if err := os.WriteFile(store, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	refuse.Store(false)
	waitUntil("address store unreadable", func(prog, src error, n int) bool {
		return n > 0 && prog == nil && src != nil && !errors.Is(src, ErrNoSourceChecks)
	})
	if err := os.Remove(store); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(store, 0o700); err != nil {
		t.Fatal(err)
	}
	waitUntil("all fine", func(prog, src error, n int) bool { return n > 0 && prog == nil && src == nil })
}

// TestDropLogNeverBlocksEnforcement: a kernel that refuses the log rules
// (no NFLOG) gets the table without them, and the transaction counts as
// committed; with the log accepted, the plans carry the log group.
func TestDropLogNeverBlocksEnforcement(t *testing.T) {
	for _, refuse := range []bool{true, false} {
		rep := &reports{}
		var mu sync.Mutex
		var groups []uint16
		runController(t, Config{Client: fakeAPI(t), Subnet: netip.MustParsePrefix("10.244.1.0/24"), Reporter: rep, LogGroup: 7,
			Program: func(ps ...Plan) error {
				mu.Lock()
				defer mu.Unlock()
				groups = append(groups, ps[0].LogGroup)
				if refuse && ps[0].LogGroup != 0 {
					return errors.New("program nftables table weft-policy: no such file or directory")
				}
				return nil
			}})
		deadline := time.Now().Add(5 * time.Second)
		for {
			if _, errs := rep.get(); len(errs) > 0 {
				if errs[0] != nil {
					t.Errorf("refuse %v: %v", refuse, errs[0])
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("refuse %v: nothing programmed in 5s", refuse)
			}
			time.Sleep(20 * time.Millisecond)
		}
		mu.Lock()
		want := []uint16{7}
		if refuse {
			want = []uint16{7, 0}
		}
		if !reflect.DeepEqual(groups[:len(want)], want) {
			t.Errorf("refuse %v: programmed with log groups %v, want %v first", refuse, groups, want)
		}
		mu.Unlock()
	}
}
