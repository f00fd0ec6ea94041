package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/weft-net/weft/internal/nettest"
)

// HTTPClient returns a client whose connections are opened inside n, so
// that 127.0.0.1 means n's own loopback (each weftd serves /readyz there).
func HTTPClient(n *nettest.NS) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := n.Do(func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	return &http.Client{
		Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true},
		Timeout:   3 * time.Second,
	}
}

// Get fetches url inside n and returns the status code and body.
func Get(ctx context.Context, n *nettest.NS, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := HTTPClient(n).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}

// pinger sends ICMP echo requests from inside a namespace over a raw
// socket opened there (the socket keeps the namespace, so it is used from
// any goroutine). It needs no ping binary.
type pinger struct {
	conn *icmp.PacketConn
	id   int
	seq  int
}

func newPinger(n *nettest.NS) (*pinger, error) {
	var c *icmp.PacketConn
	err := n.Do(func() error {
		var err error
		c, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("icmp socket in %s: %w", n.Name, err)
	}
	return &pinger{conn: c, id: os.Getpid() & 0xffff}, nil
}

func (p *pinger) close() { p.conn.Close() }

// ping sends one echo request to dst and waits up to timeout for its reply.
func (p *pinger) ping(dst netip.Addr, timeout time.Duration) error {
	p.seq++
	msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: p.id, Seq: p.seq, Data: []byte("weft-lab")}}
	b, err := msg.Marshal(nil)
	if err != nil {
		return err
	}
	if _, err := p.conn.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		return fmt.Errorf("ping %s: %w", dst, err)
	}
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1500)
	for {
		if err := p.conn.SetReadDeadline(deadline); err != nil {
			return err
		}
		n, from, err := p.conn.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("ping %s: no reply: %w", dst, err)
		}
		rm, err := icmp.ParseMessage(1, buf[:n])
		if err != nil || rm.Type != ipv4.ICMPTypeEchoReply {
			continue
		}
		if e, ok := rm.Body.(*icmp.Echo); ok && e.ID == p.id && e.Seq == p.seq && from.String() == dst.String() {
			return nil
		}
	}
}
