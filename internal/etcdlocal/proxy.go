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
	conns         map[net.Conn]struct{}
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
	p := &Proxy{ln: ln, conns: map[net.Conn]struct{}{}}
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
		if !p.track(c) {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go p.relay(c)
	}
}

// track registers c unless the proxy is paused.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	c.Close()
}

func (p *Proxy) relay(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	server, err := net.Dial(p.network, p.addr)
	if err != nil {
		return
	}
	if !p.track(server) {
		server.Close()
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		if err != nil && !errors.Is(err, net.ErrClosed) {
			dst.Close()
		}
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done // either side ended: end both
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
