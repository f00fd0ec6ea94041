package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/weft-net/weft/backend/vxlan"
	"github.com/weft-net/weft/internal/testkit/benchreport"
)

// The -peer-filter comparison: weft's kernel VXLAN backend with its port
// filter (table inet weft-vxlan: the set lookup of every datagram to the
// port, and the source check of every frame out of weft.1) against the
// same backend with the filter off (Config.NoPeerFilter), in interleaved
// rounds on fresh topologies: TCP connections per second between the pods
// (each connection: connect, one byte each way, close with a reset, from
// connWorkers workers) and iperf3 TCP throughput with one stream and with
// eight.

const (
	modeFiltered = "weft-vxlan"      // the filter on (weft's default)
	modeOpen     = "weft-vxlan-open" // --vxlan-peer-filter=false
	connWorkers  = 2
	connPort     = 5301
)

// filterSample is one round of one mode.
type filterSample struct{ conns, gbps, gbps8 float64 }

// measurePeerFilter measures both modes under each load and writes the
// report to w, and to the file out when it is not "".
func measurePeerFilter(ctx context.Context, o options, log *slog.Logger, w io.Writer, out string) error {
	var b strings.Builder
	root, err := benchreport.Root()
	if err != nil {
		return err
	}
	st := benchreport.NewStamp(root, "peer-filter", "go run ./bench/dataplane "+strings.Join(os.Args[1:], " "),
		"backend/vxlan", "backend/nft")
	stamp, err := st.Markdown(root)
	if err != nil {
		return err
	}
	fmt.Fprintf(&b, "%s\nMade by `%s`.\n\n", stamp, st.Command)
	fmt.Fprintf(&b, "%s, %s, %d CPUs; %d interleaved rounds per condition, each on fresh namespaces; "+
		"per round and mode: TCP connections per second between the pods for %s (%d workers; connect, 1 byte each way, close by reset), "+
		"then iperf3 TCP 1 stream and 8 streams for %s each; median (lowest–highest)\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), kernelRelease(), runtime.NumCPU(), o.rounds, o.dur, connWorkers, o.dur)
	fmt.Fprintln(&b, "| load | mode | connections/s | Gb/s (1 stream) | Gb/s (8 streams) | load average after |")
	fmt.Fprintln(&b, "|---|---|---|---|---|---|")
	var ratios []string
	for _, load := range o.loads {
		got := map[string][]filterSample{}
		err := withLoad(load, func() error {
			for round := range o.rounds {
				for _, m := range []string{modeFiltered, modeOpen} {
					fmt.Fprintf(os.Stderr, "peer filter, %s, round %d of %d: %s\n", load, round+1, o.rounds, m)
					s, err := filterRound(ctx, m, o, log)
					if err != nil {
						return fmt.Errorf("%s, %s: %w", load, m, err)
					}
					got[m] = append(got[m], s)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		la := loadavg()
		med := map[string][3]float64{}
		for _, m := range []string{modeFiltered, modeOpen} {
			var c, g, g8 []float64
			for _, s := range got[m] {
				c, g, g8 = append(c, s.conns), append(g, s.gbps), append(g8, s.gbps8)
			}
			cm, clo, chi := spread(c)
			gm, glo, ghi := spread(g)
			g8m, g8lo, g8hi := spread(g8)
			med[m] = [3]float64{cm, gm, g8m}
			fmt.Fprintf(&b, "| %s | %s | %.0f (%.0f–%.0f) | %.2f (%.2f–%.2f) | %.2f (%.2f–%.2f) | %s |\n", load, m, cm, clo, chi, gm, glo, ghi, g8m, g8lo, g8hi, la)
		}
		ratios = append(ratios, fmt.Sprintf("%s: connections/s %.3f, throughput %.3f (1 stream) and %.3f (8 streams)", load,
			med[modeFiltered][0]/med[modeOpen][0], med[modeFiltered][1]/med[modeOpen][1], med[modeFiltered][2]/med[modeOpen][2]))
	}
	fmt.Fprintf(&b, "\nWith the filter against without (ratio of the medians): %s.\n", strings.Join(ratios, "; "))
	io.WriteString(w, b.String())
	if out == "" {
		return nil
	}
	return os.WriteFile(out, []byte(b.String()), 0o644)
}

// filterRound builds the topology of mode and measures one round, after
// checking that the filter is in place in the filtered mode only.
func filterRound(ctx context.Context, mode string, o options, log *slog.Logger) (s filterSample, err error) {
	t, err := build(ctx, mode, o.queues, log)
	if err != nil {
		return s, err
	}
	defer t.close()
	if _, err := t.a.runNS().Run(pod("ping", "-c", "3", "-i", "0.2", "-W", "2", t.b.target().String())...); err != nil {
		return s, err
	}
	_, err = t.b.host.Run("nft", "list", "table", "inet", vxlan.FilterTable)
	if (err == nil) != (mode == modeFiltered) {
		return s, fmt.Errorf("table inet %s present: %v, in mode %s", vxlan.FilterTable, err == nil, mode)
	}
	if s.conns, err = connRate(t, o.dur); err != nil {
		return s, err
	}
	if s.gbps, err = iperf(ctx, t, 1, o.dur); err != nil {
		return s, err
	}
	s.gbps8, err = iperf(ctx, t, 8, o.dur)
	return s, err
}

// connRate opens TCP connections from a's pod to b's pod for d and returns
// how many completed per second.
func connRate(t *topology, d time.Duration) (float64, error) {
	addr := netip.AddrPortFrom(t.b.target(), connPort).String()
	var ln net.Listener
	if err := t.b.runNS().Do(func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		return 0, err
	}
	defer ln.Close()
	go echoOnce(ln)
	var (
		mu   sync.Mutex
		n    int
		errs []error
		wg   sync.WaitGroup
	)
	end := time.Now().Add(d)
	for range connWorkers {
		wg.Go(func() {
			k := 0
			err := t.a.runNS().Do(func() error { return dialLoop(addr, end, func() { k++ }) })
			mu.Lock()
			defer mu.Unlock()
			n += k
			errs = append(errs, err)
		})
	}
	wg.Wait()
	return float64(n) / d.Seconds(), errors.Join(errs...)
}

// dialLoop connects to addr until end, exchanging one byte each way, and
// counts each completed connection in count.
func dialLoop(addr string, end time.Time, count func()) error {
	buf := []byte{1}
	for time.Now().Before(end) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return err
		}
		tc := c.(*net.TCPConn)
		if _, err := tc.Write(buf); err != nil {
			tc.Close()
			return err
		}
		if _, err := io.ReadFull(tc, buf); err != nil {
			tc.Close()
			return err
		}
		tc.SetLinger(0) // a reset: no TIME_WAIT to run out of ports with
		tc.Close()
		count()
	}
	return nil
}

// echoOnce answers each connection's byte, then waits for its reset.
func echoOnce(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 1)
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
			io.Copy(io.Discard, c)
		}()
	}
}
