package etcdlocal

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Cluster is a multi-member embedded etcd: peers talk over 127.0.0.1,
// clients reach each member on its own unix socket through a Proxy, so that
// killing a member cuts its clients off at once, as a dead process would.
type Cluster struct {
	Members []*Member
}

// Member is one member of a Cluster. It can be stopped gracefully or killed,
// and started again on the same data and addresses.
type Member struct {
	Name string
	// Endpoint is the member's client URL ("unix:///…/m0/proxy.sock").
	Endpoint string

	mu      sync.Mutex
	dir     string
	sock    string // the member's own client socket, behind proxy
	proxy   *Proxy
	peerURL url.URL
	initial string // the initial cluster, name=peerURL,…
	etcd    *embed.Etcd
	closing chan struct{} // closed when a killed member's cleanup is done
}

// StartCluster starts n members under dir and waits until they serve. Short
// heartbeat and election timeouts make a new leader take well under a second.
func StartCluster(dir string, n int) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("start etcd cluster: %d members: need at least one", n)
	}
	c := &Cluster{}
	var initial []string
	ports, err := freePorts(n)
	if err != nil {
		return nil, fmt.Errorf("start etcd cluster: %w", err)
	}
	for i, port := range ports {
		m := &Member{
			Name:    fmt.Sprintf("m%d", i),
			dir:     filepath.Join(dir, fmt.Sprintf("m%d", i)),
			peerURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", port)},
		}
		m.sock = filepath.Join(dir, m.Name+".sock")
		if err := os.MkdirAll(m.dir, 0o700); err != nil {
			return nil, fmt.Errorf("start etcd cluster: %w", err)
		}
		if m.proxy, err = NewProxy(m.dir, "unix://"+m.sock); err != nil {
			c.Close()
			return nil, fmt.Errorf("start etcd cluster: %w", err)
		}
		m.Endpoint = m.proxy.Endpoint
		initial = append(initial, m.Name+"="+m.peerURL.String())
		c.Members = append(c.Members, m)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, m := range c.Members {
		m.initial = strings.Join(initial, ",")
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = m.Start() }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, fmt.Errorf("start etcd cluster: %w", err)
	}
	return c, nil
}

// Endpoints returns every member's client URL.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.Endpoint)
	}
	return out
}

// Leader returns the running member that is the leader, waiting up to
// timeout for the cluster to have one.
func (c *Cluster) Leader(timeout time.Duration) (*Member, error) {
	deadline := time.Now().Add(timeout)
	for {
		for _, m := range c.Members {
			if m.isLeader() {
				return m, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("etcd cluster: no leader after %s", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close kills every member and waits until all are shut down.
func (c *Cluster) Close() {
	for _, m := range c.Members {
		m.Kill()
	}
	for _, m := range c.Members {
		m.Stop() // waits for the background shutdown of the kill
		m.proxy.Close()
	}
}

// Start starts (or restarts) the member on its data directory and waits
// until it serves. With quorum lost it waits for the others to start.
func (m *Member) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.etcd != nil {
		return fmt.Errorf("etcd member %s: already running", m.Name)
	}
	if m.closing != nil {
		<-m.closing
		m.closing = nil
	}
	os.Remove(m.sock)
	cfg := baseConfig(m.Name, m.dir)
	cu := url.URL{Scheme: "unix", Path: m.sock}
	cfg.ListenClientUrls = []url.URL{cu}
	cfg.AdvertiseClientUrls = []url.URL{cu}
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.InitialCluster = m.initial
	cfg.InitialClusterToken = "weft-test"
	cfg.TickMs = 50
	cfg.ElectionMs = 500
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("etcd member %s: %w", m.Name, err)
	}
	if err := waitReady(e); err != nil {
		abandon(e)
		return fmt.Errorf("etcd member %s: %w", m.Name, err)
	}
	m.etcd = e
	m.proxy.Resume()
	return nil
}

// Stop stops the member gracefully (a leader hands its leadership over
// first); stopping a stopped member does nothing.
func (m *Member) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.etcd != nil {
		m.etcd.Close()
		m.etcd = nil
	}
	m.proxy.Pause()
	if m.closing != nil {
		<-m.closing
		m.closing = nil
	}
}

// Kill stops the member abruptly: its clients' connections are cut, raft
// stops without handing leadership over, and the rest of the shutdown runs
// in the background. Killing a stopped member does nothing.
func (m *Member) Kill() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.etcd == nil {
		return
	}
	m.proxy.Pause()
	e := m.etcd
	e.Server.HardStop()
	done := make(chan struct{})
	go func() { e.Close(); close(done) }()
	m.etcd, m.closing = nil, done
}

// Running reports whether the member is started.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etcd != nil
}

func (m *Member) isLeader() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.etcd == nil {
		return false
	}
	s := m.etcd.Server
	return s.Leader() != 0 && s.Leader() == s.MemberID()
}
