package faults

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// pingResult is what a background ping measured.
type pingResult struct {
	Lost, Sent int
	Took       time.Duration
	// LostAt is about when each lost ping was sent: between the replies
	// before and after it, by its sequence number.
	LostAt []time.Time
}

// String is the report figure: lost of sent, and how often ping really
// sent (asked every 10 ms, ping sends about every 17 ms on these machines,
// and slower under load).
func (p pingResult) String() string {
	every := time.Duration(0)
	if p.Sent > 0 {
		every = p.Took / time.Duration(p.Sent)
	}
	return fmt.Sprintf("%d (of %d, one every %.0f ms)", p.Lost, p.Sent, float64(every)/float64(time.Millisecond))
}

// startPingLoss runs pingLoss in the background; the returned function
// waits for it and returns its result.
func startPingLoss(ns *nettest.NS, dst netip.Addr, window time.Duration) func() (pingResult, error) {
	type result struct {
		p   pingResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := pingLoss(ns, dst, window)
		done <- result{p, err}
	}()
	return func() (pingResult, error) {
		r := <-done
		return r.p, r.err
	}
}

// pingLoss pings dst every 10 ms (as asked of ping) for window and returns
// the replies lost of those sent. It pings in runs of at most 3000: on a
// loaded machine ping sends more slowly than asked (a run of 9000 outlived
// nettest's two-minute command limit and was killed), and each run must
// finish well within that limit.
func pingLoss(ns *nettest.NS, dst netip.Addr, window time.Duration) (pingResult, error) {
	var p pingResult
	start := time.Now()
	for left := window; left > 0; left = window - time.Since(start) {
		n := max(1, min(3000, int(left/(10*time.Millisecond))))
		lost, at, err := pingRun(ns, dst, 10*time.Millisecond, n)
		if err != nil {
			return p, err
		}
		p.Lost, p.Sent, p.LostAt = p.Lost+lost, p.Sent+n, append(p.LostAt, at...)
	}
	p.Took = time.Since(start)
	return p, nil
}

// pingRun is e2e.PingLoss with ping's timestamps (-D): it returns the
// pings lost of count, and about when each lost one was sent.
func pingRun(ns *nettest.NS, dst netip.Addr, interval time.Duration, count int) (int, []time.Time, error) {
	started := time.Now()
	out, err := ns.Run("ping", "-D", "-i", strconv.FormatFloat(interval.Seconds(), 'f', 3, 64), "-c", strconv.Itoa(count), "-W", "1", dst.String())
	var sent, recv int
	replies := map[int]time.Time{} // icmp_seq → when its reply came
	for line := range strings.Lines(out) {
		if strings.Contains(line, "packets transmitted") {
			fmt.Sscanf(strings.TrimSpace(line), "%d packets transmitted, %d received", &sent, &recv)
			continue
		}
		m := pingReply.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		sec, _ := strconv.ParseFloat(m[1], 64)
		seq, _ := strconv.Atoi(m[2])
		if _, dup := replies[seq]; !dup {
			replies[seq] = time.Unix(0, int64(sec*1e9))
		}
	}
	if sent == 0 {
		return 0, nil, fmt.Errorf("parse ping output: no summary (%v)\n%s", err, out)
	}
	return sent - recv, lostTimes(replies, sent, started, interval), nil
}

// pingReply matches a reply line of `ping -D`: its timestamp and sequence.
var pingReply = regexp.MustCompile(`^\[(\d+\.\d+)\].*icmp_seq=(\d+)`)

// lostTimes estimates when each ping of 1..sent without a reply was sent,
// between the nearest replies before and after it (by sequence), or from
// started and interval where there is none on one side.
func lostTimes(replies map[int]time.Time, sent int, started time.Time, interval time.Duration) []time.Time {
	var at []time.Time
	for seq := 1; seq <= sent; seq++ {
		if _, ok := replies[seq]; ok {
			continue
		}
		lo, loT := 0, started
		for s := seq - 1; s >= 1; s-- {
			if t, ok := replies[s]; ok {
				lo, loT = s, t
				break
			}
		}
		hi, hiT := -1, time.Time{}
		for s := seq + 1; s <= sent; s++ {
			if t, ok := replies[s]; ok {
				hi, hiT = s, t
				break
			}
		}
		if hi < 0 {
			at = append(at, loT.Add(time.Duration(seq-lo)*interval))
			continue
		}
		at = append(at, loT.Add(hiT.Sub(loT)*time.Duration(seq-lo)/time.Duration(hi-lo)))
	}
	return at
}
