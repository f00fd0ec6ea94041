package connectivity

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// DefaultTCPPort is where probe servers listen unless told otherwise.
const DefaultTCPPort = 9471

// TCPServer answers every connection by echoing one line back; it lets a
// TCP exchange prove that a full-duplex stream crosses the overlay.
type TCPServer struct {
	ln net.Listener
	wg sync.WaitGroup
}

// ListenTCP opens the server's socket inside the namespace do enters, on
// addr (an address of that namespace, or the unspecified address).
func ListenTCP(do Do, addr netip.AddrPort) (*TCPServer, error) {
	var ln net.Listener
	err := do.Run(func() error {
		var err error
		ln, err = net.Listen("tcp", addr.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("tcp probe server: %w", err)
	}
	s := &TCPServer{ln: ln}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// Addr is the address the server listens on.
func (s *TCPServer) Addr() netip.AddrPort { return s.ln.Addr().(*net.TCPAddr).AddrPort() }

func (s *TCPServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			line := make([]byte, 128)
			n, err := c.Read(line)
			if err == nil {
				c.Write(line[:n])
			}
		}()
	}
}

// Close stops the server and waits for its connections to end.
func (s *TCPServer) Close() error {
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// TCPExchange connects from the namespace do enters to dst, sends a random
// token and expects it back. It returns the time from the first SYN to the
// echoed token.
func TCPExchange(ctx context.Context, do Do, dst netip.AddrPort, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	var c net.Conn
	err := do.Run(func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", dst.String())
		return err
	})
	if err != nil {
		return 0, err // names the address already
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	}
	var r [8]byte
	rand.Read(r[:])
	token := []byte("weft-probe " + hex.EncodeToString(r[:]))
	if _, err := c.Write(token); err != nil {
		return 0, fmt.Errorf("tcp %s: send: %w", dst, err)
	}
	got := make([]byte, len(token))
	if _, err := io.ReadFull(c, got); err != nil {
		return 0, fmt.Errorf("tcp %s: no echo: %w", dst, err)
	}
	if !bytes.Equal(got, token) {
		return 0, errors.New("tcp " + dst.String() + ": echo differs from what was sent")
	}
	return time.Since(start), nil
}
