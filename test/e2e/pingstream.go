package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// PingInterval is the interval of a PingStream: ping's -i.
const PingInterval = 10 * time.Millisecond

// PingStream is a ping running in the background from one namespace to
// one address every PingInterval, until Stop.
type PingStream struct {
	Label string // what the stream measures, e.g. "a-flannel-1 → b"
	cmd   *exec.Cmd
	out   bytes.Buffer
	done  chan error
}

// StartPing starts ping in src towards dst. The stream is killed, by its
// PID, when the test ends if Stop was not called.
func StartPing(tb testing.TB, label string, src *nettest.NS, dst netip.Addr) *PingStream {
	tb.Helper()
	p := &PingStream{Label: label, done: make(chan error, 1)}
	// -W 1: a reply is waited for at most a second; later ones are not
	// counted, so the loss is the outage's, not its tail's.
	// -D: each reply line starts with its arrival time.
	p.cmd = src.Command(context.Background(), "ping", "-n", "-D", "-i", strconv.FormatFloat(PingInterval.Seconds(), 'f', 3, 64), "-W", "1", dst.String())
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		tb.Fatalf("start ping %s: %v", label, err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	tb.Cleanup(func() {
		if p.cmd != nil {
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// PingResult is what a stopped stream saw.
type PingResult struct {
	Label      string
	Sent       int // echo requests whose sequence number is at most the last answered one
	Lost       int // of those, the ones never answered
	LongestGap int // the longest run of consecutive unanswered requests
	Tail       int // requests sent after the last answered one
	// Silence is the longest time between two replies, by their arrival
	// times: the outage as the receiver saw it, whatever ping's actual
	// interval was.
	Silence time.Duration
}

// Outage is the loss as time: lost requests × the interval.
func (r PingResult) Outage() time.Duration { return time.Duration(r.Lost) * PingInterval }

func (r PingResult) String() string {
	return fmt.Sprintf("%s: %d of %d pings lost (× %s = %s; longest gap %d requests; longest silence between replies %s)",
		r.Label, r.Lost, r.Sent, PingInterval, r.Outage(), r.LongestGap, r.Silence.Round(time.Millisecond))
}

var (
	replyLine = regexp.MustCompile(`(?m)^\[(\d+)\.(\d{6})\] .*icmp_seq=(\d+) `)
	sentLine  = regexp.MustCompile(`(\d+) packets transmitted`)
)

// Stop interrupts ping (ping, `ip netns exec` runs it in place, so the
// PID is ping's) and counts, from its per-reply lines, the requests never
// answered up to the last one answered. Requests after that (in flight
// when ping stopped, or never answered again) are Tail.
func (p *PingStream) Stop() (PingResult, error) {
	if p.cmd == nil {
		return PingResult{}, fmt.Errorf("ping %s stopped already", p.Label)
	}
	p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
	p.cmd = nil
	out := p.out.String()
	r := PingResult{Label: p.Label}
	seen := map[int]bool{}
	last := 0
	var prev time.Time
	for _, m := range replyLine.FindAllStringSubmatch(out, -1) {
		sec, _ := strconv.ParseInt(m[1], 10, 64)
		usec, _ := strconv.ParseInt(m[2], 10, 64)
		at := time.Unix(sec, usec*1000)
		if !prev.IsZero() {
			r.Silence = max(r.Silence, at.Sub(prev))
		}
		prev = at
		seq, _ := strconv.Atoi(m[3])
		seen[seq] = true
		last = max(last, seq)
	}
	m := sentLine.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("ping %s: no summary in its output:\n%s", p.Label, tail(out, 10))
	}
	transmitted, _ := strconv.Atoi(m[1])
	if last == 0 {
		return r, fmt.Errorf("ping %s: no reply to %d requests:\n%s", p.Label, transmitted, tail(out, 10))
	}
	// iputils numbers requests from 1.
	r.Sent, r.Tail = last, transmitted-last
	gap := 0
	for seq := 1; seq <= last; seq++ {
		if seen[seq] {
			gap = 0
			continue
		}
		r.Lost++
		gap++
		r.LongestGap = max(r.LongestGap, gap)
	}
	return r, nil
}
