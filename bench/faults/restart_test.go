package faults

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/test/e2e"
)

// TestWeftdRestarts: a pod on n1 pings a pod on n2 every 10 ms and streams
// TCP to it while weftd restarts on both nodes, alternately with SIGTERM
// and SIGKILL, for each backend. Goal: no ping lost, the stream completes
// intact. uvxlan forwards inside weftd, so it runs twice: started plainly,
// and under a service manager's file descriptor store (as systemd runs
// dist/weftd.service), which holds its TAP queue and receive socket while
// weftd restarts. There a frame that weftd had read and not yet sent when
// SIGKILL hit it is gone with the process (the kernel queues keep only what
// is still in them), so the goal allows one ping per SIGKILL.
func TestWeftdRestarts(t *testing.T) {
	for _, tc := range []struct {
		name, backend string
		fdStore       bool
	}{
		{"vxlan", "vxlan", false},
		{"uvxlan", "uvxlan", false},
		{"uvxlan with fd store", "uvxlan", true},
	} {
		t.Run(tc.name, func(t *testing.T) { restarts(t, tc.backend, tc.fdStore) })
	}
}

func restarts(t *testing.T, backend string, fdStore bool) {
	n := scale(4, 20)
	c := e2e.NewCluster(t, e2e.Options{Nodes: 2, Args: []string{"--backend", backend}, FDStore: fdStore})
	a, b := c.Nodes[0].CNI.AddPod(t, "a"), c.Nodes[1].CNI.AddPod(t, "b")
	// Ready means a node's own lease and dataplane, not that it has
	// programmed the other node yet: wait for the pods to reach each other
	// before the fault.
	e2e.Eventually(t, 10*time.Second, "a reaches b", func() error { return e2e.Ping(a.NS, b.IP) })
	streamFor := time.Duration(scale(10, 60)) * time.Second
	stream := make(chan error, 1)
	go func() { stream <- pacedStream(a.NS, b.NS, b.IP, streamFor) }()
	waitPings := startPingLoss(a.NS, b.IP, streamFor+2*time.Second)
	start := time.Now()
	var windows []restartWindow
	for i := range n {
		node := c.Nodes[i%2]
		w := restartWindow{what: node.Label + " SIGTERM", from: time.Now()}
		if i%4 >= 2 {
			w.what = node.Label + " SIGKILL"
			node.Kill()
			node.Start()
		} else {
			node.Restart()
		}
		node.WaitReady()
		w.to = time.Now()
		windows = append(windows, w)
		// Spread the restarts over the stream.
		if left := streamFor - time.Since(start); left > 0 {
			time.Sleep(min(left/time.Duration(n-i), time.Second)) // pacing, not synchronisation
		}
	}
	p, err := waitPings()
	if err != nil {
		t.Fatal(err)
	}
	if p.Lost > 0 {
		t.Logf("lost pings by restart: %s", lostByWindow(p.LostAt, windows))
	}
	serr := <-stream
	how := "backend " + backend
	if fdStore {
		how += " under a file descriptor store (systemd's FileDescriptorStoreMax=, dist/weftd.service)"
	}
	r := row{Fault: fmt.Sprintf("%d weftd restarts (half SIGTERM, half SIGKILL) on two nodes, %s, ping every 10 ms (asked) and a %s TCP stream", n, how, streamFor),
		Measured: "pings lost; stream completed intact",
		Figure:   fmt.Sprintf("%s; %s", p, yesNo(serr == nil)),
		Goal:     "0; yes", Pass: p.Lost == 0 && serr == nil}
	if fdStore {
		kills := n / 2
		r.Goal = fmt.Sprintf("at most %d, one in flight per SIGKILL; yes", kills)
		r.Pass = p.Lost <= kills && serr == nil
	}
	if backend == "uvxlan" && !fdStore {
		// uvxlan encapsulates in weftd itself: with nobody holding its TAP
		// queue and socket while weftd restarts, nothing forwards, so pings
		// sent then are lost (TCP retransmits).
		r.Gap = "uvxlan forwards in weftd; without a file descriptor store a restart pauses its dataplane"
		if perRestart := 25; serr != nil || p.Lost > perRestart*n {
			t.Errorf("uvxlan: %d pings lost over %d restarts (bound %d each), stream: %v", p.Lost, n, perRestart, serr)
		}
	}
	if fdStore {
		for _, node := range c.Nodes {
			if err := node.Keeper.Err(); err != nil {
				t.Errorf("%s: malformed message to the store: %v", node.Label, err)
			}
			if names := node.Keeper.Names(); !slices.Equal(names, []string{"weft-u.1-tap0", "weft-u.1-rx0"}) {
				t.Errorf("%s: the store holds %q, want the TAP queue and the receive socket", node.Label, names)
			}
		}
	}
	record(t, r)
	if serr != nil {
		t.Log(serr)
	}
}

// restartWindow is one restart of weftd: from the signal to ready again.
type restartWindow struct {
	what     string
	from, to time.Time
}

// lostByWindow says how many of the lost pings were sent during each
// restart (or in the second after it: a reply can be lost after ready),
// and how many at other times.
func lostByWindow(lostAt []time.Time, ws []restartWindow) string {
	counts := make([]int, len(ws))
	var other []string
	for _, at := range lostAt {
		i := slices.IndexFunc(ws, func(w restartWindow) bool { return !at.Before(w.from) && at.Before(w.to.Add(time.Second)) })
		if i < 0 {
			other = append(other, at.Format("15:04:05.000"))
			continue
		}
		counts[i]++
	}
	var parts []string
	for i, w := range ws {
		parts = append(parts, fmt.Sprintf("%s %s (down to ready %s): %d", w.what, w.from.Format("15:04:05.000"),
			w.to.Sub(w.from).Round(time.Millisecond), counts[i]))
	}
	if len(other) > 0 {
		parts = append(parts, fmt.Sprintf("outside the restarts: %d at %s", len(other), strings.Join(other, " ")))
	}
	return strings.Join(parts, "; ")
}

// pacedStream sends pseudo-random data over TCP from src to dst at about
// 2 MB/s for d and checks that it arrived intact.
func pacedStream(src, dst *nettest.NS, dstIP netip.Addr, d time.Duration) error {
	ln, err := dst.Listen("tcp", net.JoinHostPort(dstIP.String(), "0"))
	if err != nil {
		return err
	}
	defer ln.Close()
	got := make(chan [32]byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(got)
			return
		}
		defer c.Close()
		h := sha256.New()
		io.Copy(h, c)
		got <- [32]byte(h.Sum(nil))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	conn, err := src.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return err
	}
	conn.SetDeadline(time.Now().Add(d + time.Minute))
	h := sha256.New()
	r := rand.NewChaCha8([32]byte{14})
	buf := make([]byte, 32<<10)
	tick := time.NewTicker(16 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(d); time.Now().Before(end); <-tick.C {
		r.Read(buf)
		h.Write(buf)
		if _, err := conn.Write(buf); err != nil {
			conn.Close()
			return fmt.Errorf("send: %w", err)
		}
	}
	conn.Close()
	select {
	case sum, ok := <-got:
		if !ok || sum != [32]byte(h.Sum(nil)) {
			return errors.New("stream corrupted or cut: sha256 differs")
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("receive: %w", ctx.Err())
	}
}
