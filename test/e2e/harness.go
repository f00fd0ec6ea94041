// Package e2e holds weft's end-to-end tests: an underlay switch, node
// namespaces each running the real weftd binary against a real (embedded)
// etcd, and pods wired by the real weft CNI plugin through libcni. Every
// namespace is created by the test and deleted at its end.
package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/etcdlocal"
	"github.com/weft-net/weft/internal/fdstore"
	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
	"github.com/weft-net/weft/subnet"
)

// Prefix is the etcd prefix the tests use (Flannel's default).
const Prefix = "/coreos.com/network"

// Cluster is a set of test nodes sharing an underlay and an etcd.
type Cluster struct {
	T         testing.TB
	Underlay  *nettest.Underlay
	Etcd      *etcdlocal.Server  // the single member, unless EtcdMembers > 1
	EtcdHA    *etcdlocal.Cluster // the members, when EtcdMembers > 1
	EtcdHost  *EtcdHost          // where nodes reach etcd, with EtcdOnUnderlay
	Client    *clientv3.Client
	endpoints string
	Dir       string
	Nodes     []*Node
	weftd     string
	weft      string
	v6        netip.Prefix // underlay IPv6 prefix for dual-stack; invalid if none
	fdStore   bool
	// OnNode, if set, runs on every new node before weftd starts there.
	OnNode func(*Node)
}

// Options shape a cluster.
type Options struct {
	Nodes      int
	Config     string       // network config JSON; default 10.244.0.0/16 vxlan
	UnderlayV6 netip.Prefix // also give every host an IPv6 underlay address from here
	// UnderlayMTU is the MTU of every host's underlay link (0: 1500).
	UnderlayMTU int
	Args        []string // extra weftd arguments for every node
	// EtcdMembers > 1 runs an etcd cluster of that many members instead of
	// a single one; weftd and the test client get every member's endpoint.
	EtcdMembers int
	// EtcdOnUnderlay makes weftd reach the (single) etcd over the underlay,
	// at Cluster.EtcdHost, instead of through its unix socket.
	EtcdOnUnderlay bool
	// NoConfig leaves the network config out of etcd, for tests of a
	// daemon that starts before it is written.
	NoConfig bool
	// Weftd is the weftd executable to run; default: built from this tree.
	// Benchmarks set it to compare with an earlier build.
	Weftd string
	// FDStore runs every node's weftd as systemd runs a unit with
	// FileDescriptorStoreMax=: a Keeper (internal/fdstore) takes the files
	// weftd stores and passes them to the next weftd it starts.
	FDStore bool
}

// NewCluster builds the underlay, etcd and the nodes, and starts weftd on
// each node. Everything is torn down when the test ends.
func NewCluster(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	nettest.RequireRoot(tb)
	if opts.Config == "" {
		opts.Config = `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`
	}
	c := &Cluster{T: tb, Dir: tb.TempDir(), v6: opts.UnderlayV6, fdStore: opts.FDStore,
		weftd: opts.Weftd, weft: nettest.Binary(tb, "weft")}
	if c.weftd == "" {
		c.weftd = nettest.Binary(tb, "weftd")
	}
	if err := os.MkdirAll(filepath.Join(c.Dir, "etcd"), 0o700); err != nil {
		tb.Fatal(err)
	}
	var err error
	var endpoints []string
	if opts.EtcdMembers > 1 {
		if c.EtcdHA, err = etcdlocal.StartCluster(filepath.Join(c.Dir, "etcd"), opts.EtcdMembers); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(c.EtcdHA.Close)
		endpoints = c.EtcdHA.Endpoints()
	} else {
		if c.Etcd, err = etcdlocal.Start(filepath.Join(c.Dir, "etcd")); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(c.Etcd.Close)
		endpoints = []string{c.Etcd.Endpoint}
	}
	c.endpoints = strings.Join(endpoints, ",")
	c.Client, err = clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Client.Close() })
	if !opts.NoConfig {
		c.Put(Prefix+"/config", opts.Config)
	}
	c.Underlay = nettest.NewUnderlay(tb, netip.MustParsePrefix("192.168.77.0/24"), opts.UnderlayMTU)
	if opts.EtcdOnUnderlay {
		if c.Etcd == nil {
			tb.Fatal("EtcdOnUnderlay needs a single etcd member")
		}
		c.EtcdHost = AddEtcdHost(tb, c.Underlay, "etcd", c.Etcd.Endpoint)
		c.endpoints = c.EtcdHost.Proxy.Endpoint
	}
	for i := range opts.Nodes {
		c.AddNode(fmt.Sprintf("n%d", i+1), opts.Args...)
	}
	for _, n := range c.Nodes {
		n.WaitReady()
	}
	return c
}

// Endpoints is the etcd endpoint list the nodes are given.
func (c *Cluster) Endpoints() string { return c.endpoints }

// Put writes a key to etcd.
func (c *Cluster) Put(key, value string) {
	c.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Client.Put(ctx, key, value); err != nil {
		c.T.Fatalf("etcd put %s: %v", key, err)
	}
}

// Node is a test host running weftd.
type Node struct {
	*nettest.Host
	c          *Cluster
	Label      string
	SubnetFile string
	LogFile    string
	Args       []string
	// Prog, if set, is the daemon binary to start instead of weftd (for
	// example weftd installed as flanneld); Env is added to its environment.
	Prog string
	Env  []string
	// OwnArgs makes Args the daemon's whole command line: none of weftd's
	// flags are added (for a real flanneld, whose flags differ).
	OwnArgs bool
	CNI     *plugintest.Node
	// Keeper holds the files weftd stores across its restarts, with
	// Options.FDStore; nil otherwise.
	Keeper *fdstore.Keeper
	cmd    *exec.Cmd
	done   chan error
}

// AddNode plugs a new host into the underlay and starts weftd on it.
func (c *Cluster) AddNode(label string, args ...string) *Node {
	c.T.Helper()
	n := c.NewNode(label, args...)
	n.Start()
	return n
}

// NewNode plugs a new host into the underlay, ready for weftd, without
// starting it: the test calls Start (for example on many nodes at once).
func (c *Cluster) NewNode(label string, args ...string) *Node {
	c.T.Helper()
	h := c.Underlay.AddHost(c.T, label, "eth0")
	if c.v6.IsValid() {
		a := c.v6.Addr()
		for range len(c.Nodes) + 1 {
			a = a.Next()
		}
		if err := namespace.AddAddr(h.NS, "eth0", netip.PrefixFrom(a, c.v6.Bits())); err != nil {
			c.T.Fatal(err)
		}
	}
	dir := filepath.Join(c.Dir, label)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.T.Fatal(err)
	}
	n := &Node{Host: h, c: c, Label: label, SubnetFile: filepath.Join(dir, "subnet.env"),
		LogFile: filepath.Join(dir, "weftd.log"), Args: args}
	n.CNI = plugintest.NewNode(c.T, h.NS, c.weft, n.SubnetFile, plugintest.Options{DataDir: filepath.Join(dir, "cni")})
	c.Nodes = append(c.Nodes, n)
	if c.fdStore {
		k, err := fdstore.NewKeeper(dir)
		if err != nil {
			c.T.Fatal(err)
		}
		n.Keeper = k
		c.T.Cleanup(k.Close) // after weftd stops (cleanups run last first)
	}
	if c.OnNode != nil {
		c.OnNode(n)
	}
	c.T.Cleanup(func() {
		n.Stop()
		if c.T.Failed() {
			b, _ := os.ReadFile(n.LogFile)
			c.T.Logf("weftd log of %s:\n%s", label, tail(string(b), 60))
		}
	})
	return n
}

func tail(s string, lines int) string {
	ls := strings.Split(s, "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// Start starts weftd in the node's namespace.
func (n *Node) Start() {
	n.c.T.Helper()
	if n.cmd != nil {
		n.c.T.Fatalf("weftd on %s already running", n.Label)
	}
	prog := n.c.weftd
	if n.Prog != "" {
		prog = n.Prog
	}
	args := append([]string{prog,
		"--etcd-endpoints", n.c.endpoints,
		"--subnet-file", n.SubnetFile,
		"--iface", "eth0",
		"--health-addr", "127.0.0.1:9470",
		"--log-level", "debug",
	}, n.Args...)
	if n.OwnArgs {
		args = append([]string{prog}, n.Args...)
	}
	log, err := os.OpenFile(n.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		n.c.T.Fatal(err)
	}
	if n.Keeper != nil {
		args = fdstore.Wrap(args)
	}
	cmd := n.Command(context.Background(), args...)
	cmd.Stdout, cmd.Stderr = log, log
	if len(n.Env) > 0 {
		cmd.Env = append(os.Environ(), n.Env...)
	}
	closeFiles := func() {}
	if n.Keeper != nil {
		var err error
		if closeFiles, err = n.Keeper.Prepare(cmd); err != nil {
			log.Close()
			n.c.T.Fatalf("start weftd on %s: %v", n.Label, err)
		}
	}
	err = cmd.Start()
	closeFiles()
	if err != nil {
		log.Close()
		n.c.T.Fatalf("start weftd on %s: %v", n.Label, err)
	}
	n.cmd, n.done = cmd, make(chan error, 1)
	go func() { n.done <- cmd.Wait(); log.Close() }()
}

// Stop sends SIGTERM to weftd (the process started by Start) and waits.
func (n *Node) Stop() {
	if n.cmd == nil {
		return
	}
	// `ip netns exec` execs weftd in place, so the PID is weftd's.
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(10 * time.Second):
		n.cmd.Process.Kill()
		<-n.done
		n.c.T.Errorf("weftd on %s did not stop within 10s of SIGTERM", n.Label)
	}
	n.cmd = nil
}

// Exited waits up to timeout for weftd to exit by itself and returns its
// exit error; ok is false if it is still running.
func (n *Node) Exited(timeout time.Duration) (err error, ok bool) {
	if n.cmd == nil {
		return nil, false
	}
	select {
	case err = <-n.done:
		n.cmd = nil
		return err, true
	case <-time.After(timeout):
		return nil, false
	}
}

// Restart stops and starts weftd.
func (n *Node) Restart() {
	n.Stop()
	n.Start()
}

// WaitReady waits until weftd's /readyz answers 200.
func (n *Node) WaitReady() {
	n.c.T.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _, err := n.HTTPGet("http://127.0.0.1:9470/readyz")
		if err == nil && code == 200 {
			return
		}
		select {
		case err := <-n.done:
			n.done <- err
			b, _ := os.ReadFile(n.LogFile)
			n.c.T.Fatalf("weftd on %s exited: %v\n%s", n.Label, err, tail(string(b), 40))
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(n.LogFile)
			n.c.T.Fatalf("weftd on %s not ready after 30s (last: %d %v)\n%s", n.Label, code, err, tail(string(b), 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Ping pings dst from ns once (or count times) and reports success.
func Ping(ns *nettest.NS, dst netip.Addr, extra ...string) error {
	args := append([]string{"ping", "-c", "1", "-W", "2"}, extra...)
	_, err := ns.Run(append(args, dst.String())...)
	return err
}

// Eventually polls cond until it returns nil or the timeout passes; it
// returns how long it took.
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() error) time.Duration {
	tb.Helper()
	start := time.Now()
	var err error
	for time.Since(start) < timeout {
		if err = cond(); err == nil {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatalf("%s: not within %s: %v", what, timeout, err)
	return 0
}

// Output runs argv in ns and returns its output; the test fails on error.
func Output(tb testing.TB, ns *nettest.NS, argv ...string) string {
	tb.Helper()
	return nettest.MustRun(tb, ns, argv...)
}

// Subnet returns the node subnet from the node's subnet file.
func (n *Node) Subnet() netip.Prefix {
	n.c.T.Helper()
	f, err := subnet.ReadFile(n.SubnetFile)
	if err != nil {
		n.c.T.Fatal(err)
	}
	return f.Subnet.Masked()
}

// PID is weftd's process ID (`ip netns exec` execs it in place).
func (n *Node) PID() int {
	if n.cmd == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// Binary returns the weftd binary built for the tests.
func Binary(tb testing.TB) string { return nettest.Binary(tb, "weftd") }

func runOutput(bin string, args ...string) (string, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "NODE_NAME=")
	b, err := cmd.CombinedOutput()
	return string(b), err
}

// ModuleRootDir is the repository root.
func ModuleRootDir(tb testing.TB) string { return nettest.ModuleRoot(tb) }
