package daemon

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/weft-net/weft/subnet"
)

// fakePresence is a claim the test holds or hands to another node.
type fakePresence struct {
	mu      sync.Mutex
	held    bool
	err     error
	changed chan struct{}
}

func newFakePresence(held bool, err error) *fakePresence {
	return &fakePresence{held: held, err: err, changed: make(chan struct{}, 1)}
}

func (p *fakePresence) Changed() <-chan struct{} { return p.changed }

func (p *fakePresence) Held() (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held, p.err
}

func (p *fakePresence) set(held bool, err error) {
	p.mu.Lock()
	p.held, p.err = held, err
	p.mu.Unlock()
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// TestDaemonFollowsPresence: no lease is acquired before the node's address
// is claimed, and /readyz's reason says why; when another node takes the
// claim from a running daemon (its own had lapsed), the session ends, the
// daemon is not ready and says why, and it acquires again once the address
// is its own.
func TestDaemonFollowsPresence(t *testing.T) {
	taken := fmt.Errorf("%w: 192.168.77.1 is advertised by the running node \"other\"", subnet.ErrPublicIPTaken)
	p := newFakePresence(false, taken)
	reg := &fakeRegistry{cfg: testConfig(t)}
	d, fb, _ := startDaemonMetrics(t, reg, filepath.Join(t.TempDir(), "subnet.env"), func(c *Config) { c.Presence = p })
	fb.markReady()
	waitFor(t, func() bool { return strings.Contains(d.Waiting(), `running node "other"`) })
	reg.mu.Lock()
	n := len(reg.acquired)
	reg.mu.Unlock()
	if n != 0 || d.Ready() {
		t.Fatalf("acquired %d leases, ready %v, while another node holds the address", n, d.Ready())
	}
	p.set(true, nil)
	waitFor(t, func() bool { return d.Ready() && d.Waiting() == "" })

	p.set(false, taken) // lapsed, and another node claimed it meanwhile
	waitFor(t, func() bool { return !d.Ready() && strings.Contains(d.Waiting(), `running node "other"`) })
	p.set(false, errors.New("presence: the record lapsed; claiming the address again")) // etcd out of reach only
	p.set(true, nil)
	waitFor(t, func() bool { reg.mu.Lock(); defer reg.mu.Unlock(); return len(reg.acquired) == 2 })
	waitFor(t, func() bool { return d.Ready() })
}
