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
// clients reach each member on its own unix socket.
type Cluster struct {
	Members []*Member
}

// Member is one member of a Cluster. It can be stopped (as if killed) and
// restarted on the same data and addresses.
type Member struct {
	Name string
	// Endpoint is the member's client URL ("unix:///…/m0.sock").
	Endpoint string

	mu      sync.Mutex
	dir     string
	sock    string
	peerURL url.URL
	initial string // the initial cluster, name=peerURL,…
	etcd    *embed.Etcd
}

// StartCluster starts n members under dir and waits until they serve. Short
// heartbeat and election timeouts make a new leader take well under a second.
func StartCluster(dir string, n int) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("start etcd cluster: %d members: need at least one", n)
	}
	c := &Cluster{}
	var initial []string
	for i := range n {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("start etcd cluster: %w", err)
		}
		m := &Member{
			Name:    fmt.Sprintf("m%d", i),
			dir:     filepath.Join(dir, fmt.Sprintf("m%d", i)),
			peerURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", port)},
		}
		m.sock = filepath.Join(dir, m.Name+".sock")
		m.Endpoint = "unix://" + m.sock
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

// Close stops every member.
func (c *Cluster) Close() {
	for _, m := range c.Members {
		m.Stop()
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
		e.Close()
		return fmt.Errorf("etcd member %s: %w", m.Name, err)
	}
	m.etcd = e
	return nil
}

// Stop stops the member; stopping a stopped member does nothing.
func (m *Member) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.etcd != nil {
		m.etcd.Close()
		m.etcd = nil
	}
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
