package connectivity

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"text/tabwriter"
	"time"
)

// Endpoint is one end of the matrix: an address that answers echo
// requests and runs a TCP echo server on TCPPort, and (for a source) a way
// into its namespace.
type Endpoint struct {
	Name    string
	Addr    netip.Addr
	TCPPort uint16
	Do      Do // enters the endpoint's namespace to send from it
}

// Options tune a measurement.
type Options struct {
	Count   int           // echo requests per pair; 3
	Timeout time.Duration // per request and per TCP exchange; 1s
}

func (o Options) withDefaults() Options {
	if o.Count == 0 {
		o.Count = 3
	}
	if o.Timeout == 0 {
		o.Timeout = time.Second
	}
	return o
}

// Pair is the measurement from one endpoint to another.
type Pair struct {
	From, To string
	Ping     Stats // small echo requests (84 bytes)
	// DF is the echo requests of DFSize bytes (the MTU of the source's
	// route to the destination) with DF set, sent when the small ones
	// came back; DFSize is 0 when none were sent.
	DF     Stats
	DFSize int
	TCP    time.Duration // the TCP exchange's duration
	TCPErr error
}

// OK reports whether every echo request, small and DF, came back and the
// TCP exchange worked.
func (p Pair) OK() bool {
	return p.Ping.Received == p.Ping.Sent && p.Ping.Sent > 0 && p.TCPErr == nil &&
		p.DF.Received == p.DF.Sent
}

// BlackHole reports whether small echo requests came back but full-size
// ones with DF set were lost without a word: an MTU black hole on the path
// (a hop that drops large packets without an ICMP "fragmentation needed").
// A DF probe refused with "fragmentation needed" is not one: the path
// reported its smaller MTU (see PathMTUReported).
func (p Pair) BlackHole() bool {
	return p.dfFailed() && !errors.As(p.DF.Err, new(*FragNeededError))
}

// PathMTUReported returns the MTU a hop (or the source's own VXLAN device)
// announced when it refused the full-size DF probes with "fragmentation
// needed" (0 when it named none); ok is false unless that is why they
// failed. Path MTU discovery works, but the overlay's MTU is larger than
// the path's.
func (p Pair) PathMTUReported() (mtu int, ok bool) {
	var fn *FragNeededError
	if !p.dfFailed() || !errors.As(p.DF.Err, &fn) {
		return 0, false
	}
	return fn.MTU, true
}

// dfFailed: small echo requests came back, none of the DF ones did.
func (p Pair) dfFailed() bool {
	return p.Ping.Received > 0 && p.DFSize > 0 && p.DF.Sent > 0 && p.DF.Received == 0
}

// Matrix is every pair of a set of endpoints, sources in order.
type Matrix struct {
	Title string
	Pairs []Pair
}

// Measure probes every endpoint from every other one: sources in
// parallel, destinations in turn.
func Measure(ctx context.Context, title string, eps []Endpoint, o Options) *Matrix {
	rows := make([][]Pair, len(eps))
	var wg sync.WaitGroup
	for i, src := range eps {
		wg.Go(func() { rows[i] = MeasureFrom(ctx, src, eps, o) })
	}
	wg.Wait()
	m := &Matrix{Title: title}
	for _, r := range rows {
		m.Pairs = append(m.Pairs, r...)
	}
	return m
}

// MeasureFrom probes every other endpoint from src, in turn.
func MeasureFrom(ctx context.Context, src Endpoint, eps []Endpoint, o Options) []Pair {
	o = o.withDefaults()
	var out []Pair
	pg, err := NewPinger(src.Do)
	for _, dst := range eps {
		if dst.Name == src.Name {
			continue
		}
		p := Pair{From: src.Name, To: dst.Name}
		if err != nil {
			p.Ping, p.TCPErr = Stats{Sent: o.Count, Err: err}, err
			out = append(out, p)
			continue
		}
		p.Ping = pg.PingN(dst.Addr, o.Count, 84, false, o.Timeout)
		if p.Ping.Received > 0 {
			if mtu, err := linkMTU(src.Do, dst.Addr); err != nil {
				p.DF = Stats{Sent: 1, Err: err}
			} else {
				p.DFSize, p.DF = mtu, pg.PingN(dst.Addr, o.Count, mtu, true, o.Timeout)
			}
		}
		p.TCP, p.TCPErr = TCPExchange(ctx, src.Do, netip.AddrPortFrom(dst.Addr, dst.TCPPort), o.Timeout)
		out = append(out, p)
	}
	if pg != nil {
		pg.Close()
	}
	return out
}

// Failures counts the pairs that are not OK.
func (m *Matrix) Failures() int {
	n := 0
	for _, p := range m.Pairs {
		if !p.OK() {
			n++
		}
	}
	return n
}

// Render prints one line per pair: loss, round trip, the DF probes of the
// route's MTU and the TCP exchange; a smaller path MTU that the path
// reported, or an MTU black hole, is named.
func (m *Matrix) Render(w io.Writer) error {
	fmt.Fprintf(w, "%s\n", m.Title)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  from\tto\tloss\trtt min/avg/max\tdf (MTU)\ttcp\t")
	for _, p := range m.Pairs {
		rtt := "-"
		if p.Ping.Received > 0 {
			rtt = fmt.Sprintf("%s/%s/%s", msec(p.Ping.Min), msec(p.Ping.Avg), msec(p.Ping.Max))
		}
		tcp := "ok " + msec(p.TCP)
		if p.TCPErr != nil {
			tcp = "FAIL: " + p.TCPErr.Error()
		}
		mark := "  "
		if !p.OK() {
			mark = "✗ "
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%.0f%%\t%s\t%s\t%s\t\n", mark, p.From, p.To, 100*p.Ping.Loss(), rtt, dfColumn(p), tcp)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d/%d pairs ok\n", len(m.Pairs)-m.Failures(), len(m.Pairs))
	if err != nil {
		return err
	}
	for _, p := range m.Pairs {
		if err := renderMTU(w, p); err != nil {
			return err
		}
	}
	return nil
}

// renderMTU names what stops a pair's full-size DF probes: a path MTU
// smaller than the overlay's that the path reported, or a black hole.
func renderMTU(w io.Writer, p Pair) error {
	var err error
	if _, ok := p.PathMTUReported(); ok {
		_, err = fmt.Fprintf(w, "✗ %s → %s: path MTU smaller than the overlay's, reported by the path: small packets cross, %d-byte packets with DF set are refused (%s); lower Backend.MTU in the network config to the path's MTU (or raise the underlay's MTU)\n",
			p.From, p.To, p.DFSize, dfReason(p.DF.Err))
	} else if p.BlackHole() {
		_, err = fmt.Fprintf(w, "✗ %s → %s: MTU black hole: small packets cross, %d-byte packets with DF set do not (%s); a hop on the path drops large packets without saying so (a lower MTU, or a firewall dropping large VXLAN or WireGuard datagrams): fix the underlay MTU or lower the overlay MTU\n",
			p.From, p.To, p.DFSize, dfReason(p.DF.Err))
	}
	return err
}

// dfColumn is the DF probes' outcome: "-" when none were sent, else the
// replies out of the requests and the size.
func dfColumn(p Pair) string {
	switch {
	case p.DF.Sent == 0:
		return "-"
	case p.DFSize == 0:
		return "FAIL: " + dfReason(p.DF.Err)
	case p.DF.Received == p.DF.Sent:
		return fmt.Sprintf("ok %d", p.DFSize)
	}
	return fmt.Sprintf("%d/%d at %d: %s", p.DF.Received, p.DF.Sent, p.DFSize, dfReason(p.DF.Err))
}

func dfReason(err error) string {
	if err == nil {
		return "lost"
	}
	return err.Error()
}

func msec(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }
