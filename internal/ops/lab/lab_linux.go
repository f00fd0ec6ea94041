package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/weft-net/weft/internal/etcdlocal"
	"github.com/weft-net/weft/internal/namespace"
)

// Lab is a running lab, owned by this process.
type Lab struct {
	opts  Options
	State *State
	lock  *lock
	etcd  *etcdlocal.Server
	cli   *clientv3.Client
	ns    map[string]*namespace.NS // by namespace name
	nodes []*node
}

// Start builds the lab described by opts and returns once every weftd is
// ready, every pod is wired and every node has programmed every other
// node's subnet. It first removes the debris of a dead lab with the same
// state directory, and refuses with ErrRunning while a live one holds it.
// On failure it removes whatever it made. The caller must Close the lab.
func Start(ctx context.Context, opts Options) (*Lab, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if opts.Weftd == "" || opts.CNIBin == "" {
		return nil, errors.New("lab: Weftd and CNIBin must be set (see Options.FindBinaries)")
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("lab: needs root: it creates network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, errors.New("lab: needs iproute2's ip (to run weftd and commands in the namespaces): apt-get install iproute2")
	}
	lk, err := tryLock(opts.StateDir)
	if err != nil {
		return nil, err
	}
	if err := sweepLocked(opts.StateDir, opts.Log); err != nil {
		lk.release()
		return nil, fmt.Errorf("remove debris of an earlier lab: %w", err)
	}
	l := &Lab{opts: opts, lock: lk, ns: map[string]*namespace.NS{}}
	self, err := IdentifyProc(os.Getpid(), "")
	if err != nil {
		lk.release()
		return nil, err
	}
	l.State = &State{Prefix: Prefix(opts.StateDir), Proc: self, EtcdPfx: opts.EtcdPrefix,
		Network: opts.Network.String(), Underlay: opts.Underlay.String()}
	if err := l.build(ctx); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func (l *Lab) build(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	if err := l.save(); err != nil {
		return err
	}
	steps := []struct {
		name string
		f    func(context.Context) error
	}{
		{"etcd", l.startEtcd},
		{"underlay", l.buildUnderlay},
		{"weftd", l.startNodes},
		{"ready", l.waitReady},
		{"pods", l.addPods},
		{"converge", l.waitConverged},
	}
	for _, s := range steps {
		l.opts.Log.Info("lab: " + s.name)
		if err := s.f(ctx); err != nil {
			return fmt.Errorf("lab %s: %w", s.name, err)
		}
	}
	l.State.Ready = true
	return l.save()
}

func (l *Lab) save() error { return l.State.Save(l.opts.StateDir) }

func (l *Lab) startEtcd(ctx context.Context) error {
	s, err := etcdlocal.Start(l.opts.StateDir)
	if err != nil {
		return err
	}
	l.etcd = s
	l.State.Etcd = s.Endpoint
	// The client's own logger prints JSON lines among lab up's report (for
	// example while etcd stops at the end); errors come back as values.
	l.cli, err = clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	// Each node runs --backend vxlan or uvxlan; the config's fast path
	// applies to the uvxlan ones.
	conf := fmt.Sprintf(`{"Network":%q,"Backend":{"Type":"vxlan"}}`, l.opts.Network)
	if l.opts.NoFastPath {
		conf = fmt.Sprintf(`{"Network":%q,"Backend":{"Type":"vxlan","FastPath":false}}`, l.opts.Network)
	}
	if _, err := l.cli.Put(ctx, l.opts.EtcdPrefix+"/config", conf); err != nil {
		return fmt.Errorf("write network config: %w", err)
	}
	return l.save()
}

// Client returns the lab's etcd client.
func (l *Lab) Client() *clientv3.Client { return l.cli }

// NS returns an open handle on a node or pod namespace by short name.
func (l *Lab) NS(name string) (*namespace.NS, error) {
	full, err := l.State.NamespaceOf(name)
	if err != nil {
		return nil, err
	}
	return l.ns[full], nil
}

// newNS creates a lab namespace by short name and records it.
func (l *Lab) newNS(short string) (*namespace.NS, error) {
	n, err := createNS(l.State.Prefix + short)
	if err != nil {
		return nil, err
	}
	l.ns[n.Name] = n
	return n, nil
}

// Close tears the lab down: pods are DELeted through the plugin, weftd
// processes stopped, namespaces deleted, etcd stopped and the state
// directory's files removed; the lock goes last.
func (l *Lab) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	errs = append(errs, l.delPods(ctx))
	for _, n := range l.nodes {
		errs = append(errs, n.stop())
	}
	for name, n := range l.ns {
		n.Handle.Close()
		errs = append(errs, deleteNS(name))
	}
	if l.cli != nil {
		l.cli.Close()
	}
	if l.etcd != nil {
		l.etcd.Close()
	}
	// Namespaces the state lists but this process never opened (a failed
	// build), and processes recorded but not started by this process.
	errs = append(errs, sweepState(l.opts.StateDir, l.State.Prefix, l.opts.Log))
	errs = append(errs, removeFiles(l.opts.StateDir))
	os.Remove(filepath.Join(l.opts.StateDir, "lock"))
	l.lock.release()
	os.Remove(l.opts.StateDir) // only if empty: never a user's directory with other files
	return errors.Join(errs...)
}

// nodeAddr is node i's underlay address: the i-th host of the underlay.
func (l *Lab) nodeAddr(i int) netip.Addr {
	a := l.opts.Underlay.Masked().Addr()
	for range i {
		a = a.Next()
	}
	return a
}
