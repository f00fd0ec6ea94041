package uvxlan

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/vtep"
)

// warnings is a slog handler that keeps the messages of warnings.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			msg += ": " + a.Value.String()
		}
		return true
	})
	w.msgs = append(w.msgs, msg)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) count(prefix string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// TestFastPathLoadRetried: programs the kernel refuses to load are loaded
// again at the next sync, not given up for good; each failing sync is
// counted and each distinct reason logged once.
func TestFastPathLoadRetried(t *testing.T) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	var mu sync.Mutex
	refusals := []error{errors.New("refused one way"), errors.New("refused one way"), errors.New("refused another way")}
	load := func(name string, p progParams, f *fastPath) (*ebpf.Program, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(refusals) > 0 {
			err := refusals[0]
			refusals = refusals[1:]
			return nil, err
		}
		return loadProgram(name, p, f)
	}
	w := &warnings{}
	a := newUVNodeRun(t, u, "a", subnetA, func(c *Config) { c.FastPath = true }, slog.New(w),
		func(b *Backend) { b.fast.load = load })
	a.b.Set(vtep.Table{})
	deadline := time.Now().Add(15 * time.Second)
	for a.b.Stats().Events[EventFastAttaches] == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	st := a.b.Stats()
	if st.Events[EventFastAttaches] != 1 {
		t.Fatalf("fast path attaches %d after 3 refused loads, want 1 (%v)", st.Events[EventFastAttaches], st.Events)
	}
	if st.Events[EventFastLoadErrors] != 3 {
		t.Errorf("%s = %d, want 3", EventFastLoadErrors, st.Events[EventFastLoadErrors])
	}
	if n := w.count("fast path not attached"); n != 2 {
		t.Errorf("logged the refusals %d times, want 2 (once per reason): %q", n, w.msgs)
	}
}

// TestFastPathSetDoesNotBlock: Set returns while the fast path's map
// writes are held, and the maps then converge on the table in Run's sync.
func TestFastPathSetDoesNotBlock(t *testing.T) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	a := newFastNode(t, u, "a", subnetA)
	held, release := make(chan struct{}, 1), make(chan struct{})
	f := a.b.fast
	f.mu.Lock()
	f.hold = func() {
		select {
		case held <- struct{}{}:
		default:
		}
		<-release
	}
	f.mu.Unlock()
	tab := vtep.Table{
		netip.MustParsePrefix("10.244.7.0/24"): {MAC: [6]byte{2, 0, 0, 0, 0, 7}, Addr: netip.MustParseAddr("192.168.77.107")},
		netip.MustParsePrefix("10.244.8.0/24"): {MAC: [6]byte{2, 0, 0, 0, 0, 8}, Addr: netip.MustParseAddr("192.168.77.108")},
	}
	returned := make(chan struct{})
	go func() { a.b.Set(tab); close(returned) }()
	select {
	case <-returned:
	case <-time.After(2 * time.Second):
		close(release)
		t.Fatal("Set waited for the fast path's map writes")
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("Run's sync never wrote the maps")
	}
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for fastMapsDiff(a.b, tab) != "" && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	checkFastMaps(t, a.b, tab)
}
