package etcdlocal

import (
	"context"
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestStartPutGet(t *testing.T) {
	s, err := Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t.Log(s.Endpoint)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, "/k", "v"); err != nil {
		t.Fatal(err)
	}
	r, err := c.Get(ctx, "/k")
	if err != nil || string(r.Kvs[0].Value) != "v" {
		t.Fatal(r, err)
	}
}

func put(ctx context.Context, t *testing.T, c *clientv3.Client, k, v string) {
	t.Helper()
	if _, err := c.Put(ctx, k, v); err != nil {
		t.Fatal(err)
	}
}

func TestClusterLeaderStopRestart(t *testing.T) {
	cl, err := StartCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c, err := clientv3.New(clientv3.Config{Endpoints: cl.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put(ctx, t, c, "/k", "1")
	leader, err := cl.Leader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	leader.Kill()
	t.Logf("killed the leader in %s", time.Since(start))
	if leader.Running() {
		t.Fatal("stopped member still running")
	}
	next, err := cl.Leader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if next == leader {
		t.Fatal("the stopped member is still the leader")
	}
	// Writes go through once the new leader is elected (the client may
	// first hit the stopped member).
	for {
		if _, err := c.Put(ctx, "/k", "2"); err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("no write after the leader stopped: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	// The restarted member catches up.
	only, err := clientv3.New(clientv3.Config{Endpoints: []string{leader.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer only.Close()
	r, err := only.Get(ctx, "/k")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "2" {
		t.Fatalf("restarted member reads %v, %v", r, err)
	}
	// A graceful stop of a follower leaves a working cluster of two.
	var follower *Member
	for _, m := range cl.Members {
		if m != next && m != leader {
			follower = m
		}
	}
	follower.Stop()
	put(ctx, t, c, "/k", "4")
	if _, err := StartCluster(t.TempDir(), 0); err == nil {
		t.Error("StartCluster with 0 members succeeded")
	}
}

func TestProxyPauseResume(t *testing.T) {
	dir := t.TempDir()
	s, err := Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := NewProxy(dir, s.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, c := writeThenPause(t, p)
	p.Resume()
	put(ctx, t, c, "/k", "3")
	for _, target := range []string{"ftp://127.0.0.1:2379", "unix://", "http://", "127.0.0.1:2379"} {
		if _, err := NewProxy(dir, target); err == nil {
			t.Errorf("NewProxy to %q succeeded", target)
		}
	}
}

// TestProxyOnTCP relays a TCP listener to a unix socket endpoint: the
// proxy's endpoint is a plain http:// URL that a client can use.
func TestProxyOnTCP(t *testing.T) {
	dir := t.TempDir()
	s, err := Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewProxyOn(ln, s.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if want := "http://" + ln.Addr().String(); p.Endpoint != want {
		t.Fatalf("endpoint %q, want %q", p.Endpoint, want)
	}
	writeThenPause(t, p)
}

// writeThenPause writes through p, pauses it and checks that a write then
// fails. It returns the client, and a context that ends with the test.
func writeThenPause(t *testing.T, p *Proxy) (context.Context, *clientv3.Client) {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	put(ctx, t, c, "/k", "1")
	p.Pause()
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = c.Put(short, "/k", "2")
	cancelShort()
	if err == nil {
		t.Fatal("a write through a paused proxy succeeded")
	}
	return ctx, c
}

// TestStartNotReadyReturns starts one member of three whose others are
// down: it cannot become ready, and Start must return an error instead of
// hanging in etcd's Close (which waits for client servers that start only
// once the member is ready), and so must the cluster's Close after it.
func TestStartNotReadyReturns(t *testing.T) {
	cl, err := StartCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range cl.Members {
		m.Kill()
	}
	old := readyTimeout
	readyTimeout = time.Second
	defer func() { readyTimeout = old }()
	done := make(chan error, 1)
	go func() { err := cl.Members[0].Start(); cl.Close(); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a member without quorum started")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Start or Close of a member that cannot become ready did not return")
	}
}
