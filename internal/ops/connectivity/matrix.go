package connectivity

import (
	"context"
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
	Ping     Stats
	TCP      time.Duration // the TCP exchange's duration
	TCPErr   error
}

// OK reports whether every echo request came back and the TCP exchange
// worked.
func (p Pair) OK() bool { return p.Ping.Received == p.Ping.Sent && p.Ping.Sent > 0 && p.TCPErr == nil }

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

// Render prints one line per pair: loss, round trip and the TCP exchange.
func (m *Matrix) Render(w io.Writer) error {
	fmt.Fprintf(w, "%s\n", m.Title)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  from\tto\tloss\trtt min/avg/max\ttcp\t")
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
		fmt.Fprintf(tw, "%s%s\t%s\t%.0f%%\t%s\t%s\t\n", mark, p.From, p.To, 100*p.Ping.Loss(), rtt, tcp)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d/%d pairs ok\n", len(m.Pairs)-m.Failures(), len(m.Pairs))
	return err
}

func msec(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }
