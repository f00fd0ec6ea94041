package nettest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-net/weft/subnet"
)

// This file is what the tests of "only peers reach the pods" share: a
// forged VXLAN datagram as a host that holds no lease would send it, a UDP
// sink in a pod that counts what arrives, and a TCP transfer between pods
// that must lose nothing while the forgeries fly.

// ForgedVXLAN is the payload of a UDP datagram to a VXLAN port: the VXLAN
// header (VNI vni) and an Ethernet frame to dstMAC carrying a UDP datagram
// from src:40000 to dst:dport with payload. IPv4 or IPv6 by the addresses'
// family; the inner UDP checksum is right.
func ForgedVXLAN(vni int, dstMAC subnet.MAC, src, dst netip.Addr, dport uint16, payload []byte) []byte {
	udp := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(udp, 40000)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], payload)
	var ip []byte
	ethType := uint16(0x0800)
	if src.Is4() {
		ip = make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, 64, 17
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
		copy(ip[12:], src.AsSlice())
		copy(ip[16:], dst.AsSlice())
		binary.BigEndian.PutUint16(ip[10:], ^fold(sum(ip, 0)))
	} else {
		ethType = 0x86dd
		ip = make([]byte, 40)
		ip[0], ip[6], ip[7] = 0x60, 17, 64
		binary.BigEndian.PutUint16(ip[4:], uint16(len(udp)))
		copy(ip[8:], src.AsSlice())
		copy(ip[24:], dst.AsSlice())
	}
	// The pseudo-header: addresses, protocol and UDP length.
	ps := sum(src.AsSlice(), 0)
	ps = sum(dst.AsSlice(), ps)
	ps += 17 + uint32(len(udp))
	c := ^fold(sum(udp, ps))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:], c)
	eth := make([]byte, 14)
	copy(eth, dstMAC[:])
	copy(eth[6:], []byte{0x02, 0x66, 0x6f, 0x72, 0x67, 0x65}) // a MAC of no one
	binary.BigEndian.PutUint16(eth[12:], ethType)
	vx := make([]byte, 8)
	vx[0] = 0x08
	binary.BigEndian.PutUint32(vx[4:], uint32(vni)<<8)
	return bytes.Join([][]byte{vx, eth, ip, udp}, nil)
}

func sum(b []byte, s uint32) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

// SendUDP sends each datagram from src (port 0: any) to dst, from a socket
// in n.
func SendUDP(tb testing.TB, n *NS, src netip.Addr, dst netip.AddrPort, datagrams ...[]byte) {
	tb.Helper()
	var c *net.UDPConn
	if err := n.Do(func() (err error) {
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	for _, d := range datagrams {
		if _, err := c.WriteToUDPAddrPort(d, dst); err != nil {
			tb.Fatalf("send to %s: %v", dst, err)
		}
	}
}

// Sink is a UDP socket in a namespace that counts the datagrams it
// receives, by payload.
type Sink struct {
	c    *net.UDPConn
	mu   sync.Mutex
	seen map[string]int
}

// ListenUDP opens a sink on addr in n; it closes when the test ends.
func ListenUDP(tb testing.TB, n *NS, addr netip.AddrPort) *Sink {
	tb.Helper()
	s := &Sink{seen: map[string]int{}}
	if err := n.Do(func() (err error) {
		s.c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			k, _, err := s.c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.seen[string(buf[:k])]++
			s.mu.Unlock()
		}
	}()
	tb.Cleanup(func() { s.c.Close(); <-done })
	return s
}

// Count is how many datagrams with payload p arrived so far.
func (s *Sink) Count(p string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[p]
}

// WaitFor waits until a datagram with payload p arrived, or within passed.
func (s *Sink) WaitFor(p string, within time.Duration) bool {
	for t0 := time.Now(); time.Since(t0) < within; time.Sleep(10 * time.Millisecond) {
		if s.Count(p) > 0 {
			return true
		}
	}
	return false
}

// ServeByte listens on TCP addr in n and answers each connection with one
// byte, then closes it, until the test ends.
func ServeByte(tb testing.TB, n *NS, addr string) {
	tb.Helper()
	var ln net.Listener
	if err := n.Do(func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte{1})
			c.Close()
		}
	}()
}

// Transfer is a TCP stream of a known number of bytes from one namespace
// to a listener in another, running in the background.
type Transfer struct {
	want     int64
	received atomic.Int64
	done     chan error
}

// StartTransfer listens on to:port in the namespace dst and sends size
// bytes to it from a connection opened in src.
func StartTransfer(tb testing.TB, src, dst *NS, to netip.AddrPort, size int64) *Transfer {
	tb.Helper()
	var ln net.Listener
	if err := dst.Do(func() (err error) {
		ln, err = net.Listen("tcp", to.String())
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	var c net.Conn
	if err := src.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", to.String(), 10*time.Second)
		return err
	}); err != nil {
		ln.Close()
		tb.Fatal(err)
	}
	tr := &Transfer{want: size, done: make(chan error, 2)}
	go func() {
		defer ln.Close()
		sc, err := ln.Accept()
		if err != nil {
			tr.done <- err
			return
		}
		defer sc.Close()
		n, err := io.Copy(counter{&tr.received}, sc)
		if err == nil && n != size {
			err = fmt.Errorf("received %d of %d bytes", n, size)
		}
		tr.done <- err
	}()
	go func() {
		defer c.Close()
		_, err := io.CopyN(c, zeros{}, size)
		tr.done <- err
	}()
	return tr
}

// Received is how many bytes arrived so far.
func (tr *Transfer) Received() int64 { return tr.received.Load() }

// Wait waits for both ends, within the given time.
func (tr *Transfer) Wait(within time.Duration) error {
	timeout := time.After(within)
	var errs []error
	for range 2 {
		select {
		case err := <-tr.done:
			errs = append(errs, err)
		case <-timeout:
			return fmt.Errorf("transfer not done within %v: %d of %d bytes", within, tr.received.Load(), tr.want)
		}
	}
	return errors.Join(errs...)
}

type counter struct{ n *atomic.Int64 }

func (c counter) Write(p []byte) (int, error) { c.n.Add(int64(len(p))); return len(p), nil }

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }
