package flows

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/flow"
	"github.com/weft-net/weft/internal/testkit/benchreport"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// condition is what reads the node's conntrack events during a flood.
type condition int

const (
	noReader  condition = iota // --flows=false
	bounded                    // the reader as weftd runs it, at flow.DefaultRate
	unbounded                  // the same reader taking every event (Rate 0)
	nConditions
)

func (c condition) String() string {
	return [...]string{"no reader (--flows=false)", fmt.Sprintf("reader at %d events/s (weftd)", flow.DefaultRate), "reader taking every event"}[c]
}

// readerEnv makes the test binary a reader: "<netns path> <rate>".
const readerEnv = "WEFT_BENCH_FLOWS_READER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(readerEnv); spec != "" {
		os.Exit(reader(spec))
	}
	os.Exit(m.Run())
}

// readerResult is what a reader child says when it stops.
type readerResult struct {
	CPU     float64 `json:"cpu"` // seconds, user and system, since "start"
	Events  int64   `json:"events"`
	Kept    uint64  `json:"kept"` // by a ring as weftd's
	Pauses  uint64  `json:"pauses"`
	Lost    uint64  `json:"lost"`
	MaxRSS  int64   `json:"maxRSS"` // KiB, of the whole process life
	Started bool    `json:"started"`
}

func cpuNow() float64 {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// reader runs flow.Conntrack in the namespace as weftd does, handing its
// flows to a ring of weftd's size and rate. It says "ready" once
// listening, measures from "start" on stdin and prints its result as JSON
// at "stop".
func reader(spec string) int {
	path, rateS, _ := strings.Cut(spec, " ")
	rate, _ := strconv.Atoi(rateS)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	signal.Ignore(syscall.SIGINT)
	ring := flow.NewRing(4096, 1000, 1000)
	ct := &flow.Conntrack{NetNS: fd, Pods: []netip.Prefix{netip.MustParsePrefix("10.8.0.0/16")}, Rate: rate}
	var events atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ct.Run(ctx, func(f flow.Flow) { events.Add(1); ring.Add(f) }) }()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	var res readerResult
	var cpu0 float64
	var ev0 int64
	var kept0 uint64
	for in.Scan() {
		switch in.Text() {
		case "start":
			cpu0, ev0, kept0, res.Started = cpuNow(), events.Load(), ring.Stats().Last, true
		case "stop":
			res.CPU, res.Events, res.Kept = cpuNow()-cpu0, events.Load()-ev0, ring.Stats().Last-kept0
			res.Pauses, _ = ct.Paused()
			res.Lost = ct.Lost()
			var ru unix.Rusage
			unix.Getrusage(unix.RUSAGE_SELF, &ru)
			res.MaxRSS = ru.Maxrss
			cancel()
			if err := <-done; err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			json.NewEncoder(os.Stdout).Encode(res)
			return 0
		}
	}
	return 1
}

// node is the benchmark's topology: a node namespace routing between a
// client pod and a server pod, tracking connections, with a server that
// closes each connection it takes.
type node struct {
	node, client, server *nettest.NS
	dst                  netip.AddrPort
}

func newNode(b *testing.B) *node {
	n, p1, p2 := nettest.RoutedPods(b, "bfl", [2]netip.Prefix{netip.MustParsePrefix("10.8.1.0/24"), netip.MustParsePrefix("10.8.2.0/24")})
	nettest.TrackConnections(b, n)
	dst := netip.MustParseAddrPort("10.8.2.2:80")
	nettest.ServeByte(b, p2, dst.String())
	return &node{node: n, client: p1, server: p2, dst: dst}
}

// flush empties the node's conntrack table.
func (n *node) flush(b *testing.B) {
	fd, err := unix.Open(n.node.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	c, err := conntrack.Dial(&netlink.Config{NetNS: fd})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.Flush(); err != nil {
		b.Fatal(err)
	}
}

// flood opens connections from the client for d, two at a time, each
// reading the server's byte; it returns how many completed.
func (n *node) flood(b *testing.B, d time.Duration) int64 {
	var done atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	var dial net.Dialer
	for range 2 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				var c net.Conn
				if err := n.client.Do(func() (err error) {
					c, err = dial.Dial("tcp", n.dst.String())
					return err
				}); err != nil {
					continue
				}
				var one [1]byte
				if _, err := io.ReadFull(c, one[:]); err == nil {
					done.Add(1)
				}
				// A reset: no TIME_WAIT at either end, whose ports
				// would slow the next connections that draw them.
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
			}
		})
	}
	wg.Wait()
	return done.Load()
}

// sample is one condition in one round.
type sample struct {
	conns   float64 // completed a second
	res     readerResult
	seconds float64
}

// measure runs the flood once under c.
func (n *node) measure(b *testing.B, c condition, d time.Duration) sample {
	var child *exec.Cmd
	var stdin io.WriteCloser
	var stdout *bufio.Reader
	if c != noReader {
		rate := 0
		if c == bounded {
			rate = flow.DefaultRate
		}
		child = exec.Command(os.Args[0], "-test.run", "^$")
		child.Env = append(os.Environ(), readerEnv+"="+n.node.Path+" "+strconv.Itoa(rate))
		child.Stderr = os.Stderr
		var err error
		if stdin, err = child.StdinPipe(); err != nil {
			b.Fatal(err)
		}
		out, err := child.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		stdout = bufio.NewReader(out)
		if err := child.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() {
			stdin.Close()
			child.Wait()
		}()
		if l, err := stdout.ReadString('\n'); err != nil || l != "ready\n" {
			b.Fatalf("reader: %q %v", l, err)
		}
		time.Sleep(200 * time.Millisecond) // its first socket is bound
		fmt.Fprintln(stdin, "start")
	}
	start := time.Now()
	conns := n.flood(b, d)
	s := sample{seconds: time.Since(start).Seconds()}
	s.conns = float64(conns) / s.seconds
	if child != nil {
		fmt.Fprintln(stdin, "stop")
		if err := json.NewDecoder(stdout).Decode(&s.res); err != nil {
			b.Fatalf("reader's result: %v", err)
		}
	}
	return s
}

// BenchmarkConntrackFlood: each round floods the node with new
// connections for WEFT_BENCH_SECONDS (default 5) under each condition, in
// an order that turns each round. The client resets each connection once
// it has the server's byte; conntrack keeps the entry closed for 10 s, so
// the reader sees a new event for each connection and a destroy event for
// each entry that ends within the flood; the table is flushed before each
// condition.
func BenchmarkConntrackFlood(b *testing.B) {
	nettest.RequireRoot(b)
	secs := 5.0
	if s := os.Getenv("WEFT_BENCH_SECONDS"); s != "" {
		var err error
		if secs, err = strconv.ParseFloat(s, 64); err != nil || secs <= 0 {
			b.Fatalf("WEFT_BENCH_SECONDS=%q: not a number of seconds", s)
		}
	}
	d := time.Duration(secs * float64(time.Second))
	n := newNode(b)
	var rounds []round
	for i := 0; b.Loop(); i++ {
		r := round{n: i + 1, load: [2]string{benchreport.LoadAvg(" ")}}
		for k := range nConditions {
			c := (condition(i) + k) % nConditions
			r.order = append(r.order, c)
			// The table's entries from the last flood go, so each
			// condition starts from the same table.
			n.flush(b)
			r.s[c] = n.measure(b, c, d)
			b.Logf("round %d, %s: %s", r.n, c, r.s[c].line())
		}
		r.load[1] = benchreport.LoadAvg(" ")
		rounds = append(rounds, r)
	}
	report(b, rounds, secs)
}

func (s sample) line() string {
	return fmt.Sprintf("%.0f conns/s; reader %.3f CPU s (%.1f%% of a core), %d events (%d kept), %d pauses, %d lost, max RSS %.1f MiB",
		s.conns, s.res.CPU, 100*s.res.CPU/s.seconds, s.res.Events, s.res.Kept, s.res.Pauses, s.res.Lost, float64(s.res.MaxRSS)/1024)
}
