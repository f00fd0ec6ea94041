package etcdlocal

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Proxy relays a unix socket to a server's unix socket endpoint. Pause cuts
// every relayed connection and refuses new ones until Resume: to a client
// behind it the server looks unreachable, while other clients keep using
// the server directly. Tests use it to break watches at a chosen moment.
type Proxy struct {
	// Endpoint is the proxy's client URL ("unix:///…/proxy.sock").
	Endpoint string

	target string // path of the server's socket
	ln     net.Listener
	mu     sync.Mutex
	paused bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// NewProxy listens on dir/proxy.sock and relays to target, a unix:// URL.
func NewProxy(dir, target string) (*Proxy, error) {
	path, ok := strings.CutPrefix(target, "unix://")
	if !ok || path == "" {
		return nil, fmt.Errorf("etcd proxy: target %q: not a unix:// endpoint", target)
	}
	sock := filepath.Join(dir, "proxy.sock")
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("etcd proxy: %w", err)
	}
	p := &Proxy{Endpoint: "unix://" + sock, target: path, ln: ln, conns: map[net.Conn]struct{}{}}
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
	server, err := net.Dial("unix", p.target)
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
