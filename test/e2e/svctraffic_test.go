package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// serveSvc answers each connection on ln: a request "who" gets
// "<name> <source address seen>"; "sum" followed by data up to the
// client's half-close gets the data's sha256 in hex.
func serveSvc(ln net.Listener, name string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(2 * time.Minute))
			r := bufio.NewReader(c)
			req, err := r.ReadString('\n')
			if err != nil {
				return
			}
			switch req {
			case "who\n":
				src, _, _ := net.SplitHostPort(c.RemoteAddr().String())
				fmt.Fprintf(c, "%s %s\n", name, src)
			case "sum\n":
				h := sha256.New()
				if _, err := io.Copy(h, r); err == nil {
					fmt.Fprintf(c, "%x\n", h.Sum(nil))
				}
			}
		}()
	}
}

// svcWho opens one connection to addr from ns and asks who answers, within
// timeout. It
// returns the connection setup time, the pod's name and the source address
// the pod saw.
func svcWho(ns *nettest.NS, addr string, timeout time.Duration) (time.Duration, string, netip.Addr, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	c, err := ns.DialContext(ctx, "tcp", addr)
	took := time.Since(start)
	if err != nil {
		return took, "", netip.Addr{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, "who\n"); err != nil {
		return took, "", netip.Addr{}, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return took, "", netip.Addr{}, fmt.Errorf("read the answer: %w", err)
	}
	who, src, _ := strings.Cut(strings.TrimSpace(line), " ")
	a, err := netip.ParseAddr(src)
	if err != nil {
		return took, who, a, fmt.Errorf("answer %q: %w", line, err)
	}
	return took, who, a, nil
}

// svcSum sends size pseudo-random bytes to addr from ns and compares the
// sha256 the pod computed with the sent data's. It returns bytes per
// second.
func svcSum(ns *nettest.NS, addr string, size int64) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := ns.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	h := sha256.New()
	start := time.Now()
	if _, err := io.WriteString(c, "sum\n"); err != nil {
		return 0, err
	}
	r := io.TeeReader(io.LimitReader(&randReader{rand.NewChaCha8([32]byte{2})}, size), h)
	if _, err := io.Copy(c, r); err != nil {
		return 0, fmt.Errorf("send: %w", err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("read the sum: %w", err)
	}
	elapsed := time.Since(start)
	if want := hex.EncodeToString(h.Sum(nil)); strings.TrimSpace(line) != want {
		return 0, fmt.Errorf("sha256 %s at the pod, %s sent", strings.TrimSpace(line), want)
	}
	return float64(size) / elapsed.Seconds(), nil
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)].Round(10 * time.Microsecond)
}

// svcDiag returns the neighbours, the conntrack and error counters of
// each namespace, to tell a dropped packet from a refused one.
func svcDiag(nss ...*nettest.NS) string {
	var b strings.Builder
	for _, ns := range nss {
		out, err := ns.Run("sh", "-c", "ip neigh; conntrack -S | grep -v ' drop=0 ' ; nstat -az | grep -E 'Unreach|Retrans|Drop|Fail|Overflow' | grep -v ' 0 '")
		fmt.Fprintf(&b, "--- %s (%v)\n%s", ns.Name, err, out)
	}
	return b.String()
}
