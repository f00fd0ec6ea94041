package uvxlan

import (
	"context"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/vtep"
	"golang.org/x/sys/unix"
)

// memFiles is a Files that holds duplicates in memory, as a service
// manager's store would across a restart: restart hands everything held
// to the next Take.
type memFiles struct {
	mu        sync.Mutex
	held      map[string]int
	inherited map[string]*os.File
	released  []string
}

func newMemFiles() *memFiles {
	return &memFiles{held: map[string]int{}, inherited: map[string]*os.File{}}
}

func (m *memFiles) Take(name string) *os.File {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.inherited[name]
	delete(m.inherited, name)
	return f
}

func (m *memFiles) Keep(name string, fd int) error {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.held[name]; ok {
		unix.Close(old)
	}
	m.held[name] = dup
	return nil
}

func (m *memFiles) Release(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if fd, ok := m.held[name]; ok {
		unix.Close(fd)
		delete(m.held, name)
		m.released = append(m.released, name)
	}
	if f, ok := m.inherited[name]; ok {
		f.Close()
		delete(m.inherited, name)
	}
	return nil
}

func (m *memFiles) Unclaimed() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var names []string
	for n := range m.inherited {
		names = append(names, n)
	}
	return names
}

// restart is the next process starting: what is held is passed on.
func (m *memFiles) restart(t *testing.T) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for n, fd := range m.held {
		dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		m.inherited[n] = os.NewFile(uintptr(dup), n)
	}
	m.released = nil
}

func (m *memFiles) names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var names []string
	for n := range m.held {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func (m *memFiles) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, fd := range m.held {
		unix.Close(fd)
	}
	for _, f := range m.inherited {
		f.Close()
	}
}

var pingStats = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

// TestKeptFilesBridgeRestarts: with Config.Files, a restarted backend takes
// over the TAP queue and receive socket of the one before, so pings sent
// while no backend runs wait in the kernel's queues and none is lost. A
// kept TAP opened with other flags (offloads off now) is not reused but
// released and replaced, and a kept file of a queue this configuration
// does not have is released.
func TestKeptFilesBridgeRestarts(t *testing.T) {
	a, b, files := keptFilesPair(t, false)
	if got, want := files.names(), []string{"weft-u.1-rx0", "weft-u.1-tap0"}; !slices.Equal(got, want) {
		t.Fatalf("kept %q, want %q", got, want)
	}

	// 3 s of pings from a's pod every 20 ms, across a 1 s pause of a's
	// backend in the middle: both directions wait in a's queues.
	out := pingAcross(t, a, b, 150)
	time.Sleep(time.Second)
	a.stop()
	time.Sleep(time.Second)
	files.restart(t)
	cfg := a.b.Config()
	next := restartNode(t, a, b, cfg)
	checkKeptPings(t, next, out)

	// Offloads off: the kept TAP (opened with a virtio-net header) does not
	// fit; a kept queue 3 is not configured.
	a.stop()
	files.restart(t)
	extra, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	files.mu.Lock()
	files.inherited["weft-u.1-rx3"] = extra
	files.mu.Unlock()
	cfg.Plain = true
	restartNode(t, a, b, cfg)
	if outp, err := ping(a, b.podIP); err != nil {
		t.Fatalf("ping with the replaced tap: %v\n%s", err, outp)
	}
	files.mu.Lock()
	released := slices.Clone(files.released)
	files.mu.Unlock()
	if !slices.Contains(released, "weft-u.1-tap0") {
		t.Errorf("the kept tap opened with offloads was not released: released %q", released)
	}
	if left := files.Unclaimed(); len(left) != 0 {
		t.Errorf("left unclaimed: %q", left)
	}
	if got, want := files.names(), []string{"weft-u.1-rx0", "weft-u.1-tap0"}; !slices.Equal(got, want) {
		t.Errorf("kept %q, want %q", got, want)
	}
}

// keptFilesPair makes nodes a, whose backend keeps its files in the
// returned store, and b, connected and reaching each other; with fast,
// both with the fast path.
func keptFilesPair(t *testing.T, fast bool) (a, b *testNode, files *memFiles) {
	t.Helper()
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	files = newMemFiles()
	t.Cleanup(files.close)
	a = newUVNodeWith(t, u, "a", subnetA, func(c *Config) { c.Files, c.FastPath = files, fast })
	if fast {
		b = newFastNode(t, u, "b", subnetB)
	} else {
		b = newUVNode(t, u, "b", subnetB, false)
	}
	connect(t, a, b)
	if out, err := ping(a, b.podIP); err != nil {
		t.Fatalf("ping: %v\n%s", err, out)
	}
	return a, b, files
}

// pingAcross starts n pings from a's pod to b's, 20 ms apart; their
// output arrives on the channel when they end.
func pingAcross(t *testing.T, a, b *testNode, n int) <-chan []byte {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	pinger := a.pod.Command(ctx, "ping", "-n", "-q", "-c", strconv.Itoa(n), "-i", "0.02", "-W", "5", b.podIP.String())
	out := make(chan []byte, 1)
	go func() { o, _ := pinger.CombinedOutput(); out <- o }()
	return out
}

// checkKeptPings checks that nb took the kept files over and that the
// pings whose output out brings all crossed the restart, none dropped as
// from or to an unknown peer.
func checkKeptPings(t *testing.T, nb *Backend, out <-chan []byte) {
	t.Helper()
	if dp := nb.dp.Load(); dp == nil || !dp.adopted {
		t.Fatal("the restarted backend did not take the kept files over")
	}
	m := pingStats.FindSubmatch(<-out)
	if m == nil {
		t.Fatal("no ping statistics")
	}
	sent, _ := strconv.Atoi(string(m[1]))
	got, _ := strconv.Atoi(string(m[2]))
	t.Logf("across the restart: %d of %d pings answered", got, sent)
	if got != sent {
		t.Errorf("%d of %d pings lost across the restart", sent-got, sent)
	}
	if st := nb.Stats(); st.Drops["unknown_mac"]+st.Drops["not_peer"] != 0 {
		t.Errorf("frames that waited were dropped as from or to unknown peers: %v", st.Drops)
	}
}

// restartNode runs a new backend with cfg on a (whose backend is stopped)
// and programs a and b towards each other.
func restartNode(t *testing.T, a, b *testNode, cfg Config) *Backend {
	t.Helper()
	nb, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	a.b, a.stop = nb, start(t, nb, "a restarted")
	t.Cleanup(a.stop)
	connect(t, a, b)
	return nb
}

// TestKeptFilesFastPathFirstTable: with the fast path, a restarted backend
// that took kept files over starts its packet loops only once they hold
// the first table, also when that table arrives (Set) while the first sync
// is under way, after it looked for one: here while it loads the
// programs. The frames that waited in the kept queues must find their
// peers, not be dropped as from or to unknown peers. (A sync that
// programmed the late table as the routes and reported ready while the
// packet loops still held none lost every ping that waited in
// bench/faults' TestWeftdRestarts.)
func TestKeptFilesFastPathFirstTable(t *testing.T) {
	a, b, files := keptFilesPair(t, true)

	// Pings from a's pod every 20 ms across a pause of a's backend: the
	// requests wait in a's TAP queue, the replies in its receive socket.
	out := pingAcross(t, a, b, 100)
	time.Sleep(500 * time.Millisecond)
	a.stop()
	time.Sleep(500 * time.Millisecond)
	files.restart(t)
	cfg := a.b.Config()
	nb, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if nb.fast == nil {
		nettest.CannotRun(t, "kernel", "no fast path: the kernel has no tcx (Linux 6.6 or later) or weft cannot create BPF maps (CAP_BPF)")
	}
	tab := vtep.Table{b.subnet: {MAC: b.mac, Addr: b.host.Addr}}
	var once sync.Once
	// The first table arrives while the first sync loads the programs (as
	// weftd's watch may hand it over); the next sync is slowed down, so
	// that what the packet loops start with is seen.
	nb.fast.load = func(name string, p progParams, f *fastPath) (*ebpf.Program, error) {
		once.Do(func() { nb.Set(tab) })
		return loadProgram(name, p, f)
	}
	var slow sync.Once
	nb.fast.hold = func() { slow.Do(func() { time.Sleep(300 * time.Millisecond) }) }
	ready := make(chan int, 1)
	go func() {
		<-nb.Ready()
		ready <- len(nb.peers.Load().byAddr)
	}()
	a.b, a.stop = nb, start(t, nb, "a restarted")
	t.Cleanup(a.stop)
	select {
	case n := <-ready:
		if n != 1 {
			t.Errorf("ready with %d peers for the packet loops, want 1: the frames that waited meet an empty table", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the restarted backend never became ready")
	}
	checkKeptPings(t, nb, out)
}
