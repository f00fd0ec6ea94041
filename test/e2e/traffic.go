package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// Transfer sends size bytes of pseudo-random data over TCP from src to a
// listener on dst (at dstIP) and checks that what arrived hashes the same
// as what was sent. It returns the throughput in bytes per second.
func Transfer(src, dst *nettest.NS, dstIP netip.Addr, size int64) (float64, error) {
	ln, err := dst.Listen("tcp", net.JoinHostPort(dstIP.String(), "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	got := make(chan [32]byte, 1)
	errc := make(chan error, 2)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer c.Close()
		h := sha256.New()
		n, err := io.Copy(h, c)
		if err == nil && n != size {
			err = fmt.Errorf("received %d bytes, sent %d", n, size)
		}
		if err != nil {
			errc <- err
			return
		}
		got <- [32]byte(h.Sum(nil))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := src.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return 0, err
	}
	conn.SetDeadline(time.Now().Add(2 * time.Minute))
	h := sha256.New()
	r := io.TeeReader(io.LimitReader(&randReader{rand.NewChaCha8([32]byte{1})}, size), h)
	start := time.Now()
	if _, err := io.Copy(conn, r); err != nil {
		conn.Close()
		return 0, fmt.Errorf("send: %w", err)
	}
	conn.Close()
	select {
	case err := <-errc:
		return 0, fmt.Errorf("receive: %w", err)
	case sum := <-got:
		elapsed := time.Since(start)
		if sum != [32]byte(h.Sum(nil)) {
			return 0, fmt.Errorf("data corrupted: sha256 differs")
		}
		return float64(size) / elapsed.Seconds(), nil
	case <-ctx.Done():
		return 0, fmt.Errorf("receive: %w", ctx.Err())
	}
}

type randReader struct{ r *rand.ChaCha8 }

func (r *randReader) Read(p []byte) (int, error) { return r.r.Read(p) }

// RemoteAddrSeen accepts one TCP connection on a listener in dst at dstIP,
// opened from src, and returns the source address dst saw.
func RemoteAddrSeen(src, dst *nettest.NS, dstIP netip.Addr) (netip.Addr, error) {
	ln, err := dst.Listen("tcp", net.JoinHostPort(dstIP.String(), "0"))
	if err != nil {
		return netip.Addr{}, err
	}
	defer ln.Close()
	seen := make(chan netip.Addr, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(seen)
			return
		}
		c.Close()
		seen <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := src.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return netip.Addr{}, err
	}
	c.Close()
	select {
	case a, ok := <-seen:
		if !ok {
			return netip.Addr{}, fmt.Errorf("accept failed")
		}
		return a, nil
	case <-ctx.Done():
		return netip.Addr{}, ctx.Err()
	}
}

// PingLoss pings dst every interval, count times, and returns the number of
// lost replies.
func PingLoss(ns *nettest.NS, dst netip.Addr, interval time.Duration, count int) (int, string, error) {
	out, err := ns.Run("ping", "-i", strconv.FormatFloat(interval.Seconds(), 'f', 3, 64), "-c", strconv.Itoa(count), "-W", "1", dst.String())
	var sent, recv int
	if _, serr := fmt.Sscanf(findLine(out, "packets transmitted"), "%d packets transmitted, %d received", &sent, &recv); serr != nil {
		return 0, out, fmt.Errorf("parse ping output: %v (%v)", serr, err)
	}
	return sent - recv, out, nil
}

func findLine(s, sub string) string {
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
