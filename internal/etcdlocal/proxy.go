package etcdlocal

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
)

// Proxy relays client connections to an etcd server. Pause cuts every
// relayed connection and refuses new ones until Resume: to a client behind
// it the server looks unreachable, while other clients keep using the server
// directly. Tests use it to break watches at a chosen moment, and, listening
// inside a network namespace, to make an etcd reachable over a test network.
type Proxy struct {
	// Endpoint is the proxy's client URL: "unix:///…/proxy.sock" for
	// NewProxy; for NewProxyOn the listener's address with the scheme a
	// client needs to reach the target ("https://10.1.2.3:2379").
	Endpoint string

	network, addr string // where the server is
	ln            net.Listener
	mu            sync.Mutex
	paused        bool
	conns         map[net.Conn]*atomic.Bool // each relayed connection's frozen flag
	wg            sync.WaitGroup
}

// NewProxy listens on dir/proxy.sock and relays to target (see NewProxyOn).
func NewProxy(dir, target string) (*Proxy, error) {
	sock := filepath.Join(dir, "proxy.sock")
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("etcd proxy: %w", err)
	}
	p, err := NewProxyOn(ln, target)
	if err != nil {
		ln.Close()
		return nil, err
	}
	return p, nil
}

// NewProxyOn relays the connections accepted on ln, a listener the caller
// opened (for example a TCP listener inside a network namespace), to target:
// unix:///path, http://host:port or https://host:port. TLS passes through
// untouched, so an https target needs a server certificate valid for ln's
// address. The proxy owns ln from then on.
func NewProxyOn(ln net.Listener, target string) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("etcd proxy: target %q: %w", target, err)
	}
	p := &Proxy{ln: ln, conns: map[net.Conn]*atomic.Bool{}}
	switch {
	case u.Scheme == "unix" && u.Path != "":
		p.network, p.addr = "unix", u.Path
		p.Endpoint = "http://" + ln.Addr().String()
	case (u.Scheme == "http" || u.Scheme == "https") && u.Host != "":
		p.network, p.addr = "tcp", u.Host
		p.Endpoint = u.Scheme + "://" + ln.Addr().String()
	default:
		return nil, fmt.Errorf("etcd proxy: target %q: not a unix://, http:// or https:// endpoint", target)
	}
	if ln.Addr().Network() == "unix" {
		p.Endpoint = "unix://" + ln.Addr().String()
	}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		frozen := new(atomic.Bool)
		if !p.track(c, frozen) {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go p.relay(c, frozen)
	}
}

// track registers c unless the proxy is paused.
func (p *Proxy) track(c net.Conn, frozen *atomic.Bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		return false
	}
	p.conns[c] = frozen
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	c.Close()
}

func (p *Proxy) relay(client net.Conn, frozen *atomic.Bool) {
	defer p.wg.Done()
	defer p.untrack(client)
	server, err := net.Dial(p.network, p.addr)
	if err != nil {
		return
	}
	if !p.track(server, frozen) {
		server.Close()
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		err := copyUnlessFrozen(dst, src, frozen)
		if err != nil && !errors.Is(err, net.ErrClosed) {
			dst.Close()
		}
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done // either side ended: end both
}

// copyUnlessFrozen copies src to dst until src ends, dropping what it reads
// once frozen is set.
func copyUnlessFrozen(dst, src net.Conn, frozen *atomic.Bool) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !frozen.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Freeze makes every connection relayed so far go silent: what either side
// sends is dropped, and neither side is told, as when a firewall starts
// dropping packets. New connections are relayed as before.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, frozen := range p.conns {
		frozen.Store(true)
	}
}

// Pause closes every relayed connection and refuses new ones.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
	for c := range p.conns {
		c.Close()
	}
}

// Resume accepts connections again.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = false
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Pause()
	p.wg.Wait()
}
