package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	nftw "github.com/weft-net/weft/backend/nft"
)

// CheckInterval is how often Run checks the iptables-legacy rules by
// default (Flannel's --iptables-resync default): the kernel gives no notice
// of changes to them.
const CheckInterval = 5 * time.Second

// Resync is how often Run checks the iptables-nft rules by default besides
// after every nftables transaction that touched a filter table: a safety
// net for notifications lost while the subscription was renewed.
const Resync = 90 * time.Second

// Chain is the chain weft owns in each filter table.
const Chain = "WEFT-FWD"

// Config says which cluster networks to accept.
type Config struct {
	// Network and IPv6Network are the cluster networks; an unset one gets
	// no rules. At least one is required.
	Network, IPv6Network netip.Prefix
	// Accept writes the accept rules; false removes weft's (the node runs
	// with --iptables-forward-rules=false).
	Accept bool
	// CheckInterval overrides the period of the check of the
	// iptables-legacy rules (0: CheckInterval).
	CheckInterval time.Duration
	// Resync overrides the period of the full check, iptables-nft's rules
	// included (0: Resync).
	Resync time.Duration
	// NATReady, if not nil, is closed once weft's masquerade rules are in
	// place (or at once when weft does not masquerade): flanneld's nat
	// chains and nftables tables are removed only then, so that pod traffic
	// leaving the cluster is never left without masquerade. nil: at once.
	NATReady <-chan struct{}
}

// backend is one iptables backend (legacy or nft) of one family, holding the
// table a method is asked about.
type backend interface {
	// String names the iptables command that lists these rules, for
	// example ip6tables-nft.
	String() string
	// check returns why weft's chain and jump for n are not as Rules and
	// Jump say ("" when they are).
	check(n netip.Prefix) (string, error)
	// program writes weft's chain afresh and leaves exactly one jump to it,
	// appended to FORWARD unless one is there already.
	program(n netip.Prefix) error
	// removeChain deletes the rules of parent that jump or go to chain, then
	// chain itself. It reports whether chain existed.
	removeChain(table, parent, chain string) (bool, error)
}

// Forwarder keeps weft's forward accept rules in place.
type Forwarder struct {
	cfg     Config
	log     *slog.Logger
	ready   chan struct{}
	once    sync.Once
	repairs atomic.Uint64
	tools   *toolbox
	// programmed names the backends (by String) whose rules Run has
	// written (Run's goroutine only).
	programmed map[string]bool
}

// New validates cfg; nothing is programmed until Run.
func New(cfg Config, log *slog.Logger) (*Forwarder, error) {
	if !cfg.Network.IsValid() && !cfg.IPv6Network.IsValid() {
		return nil, errors.New("forward config: no cluster network")
	}
	if cfg.Network.IsValid() && !cfg.Network.Addr().Is4() {
		return nil, fmt.Errorf("forward config: Network %s is not IPv4", cfg.Network)
	}
	if cfg.IPv6Network.IsValid() && !cfg.IPv6Network.Addr().Is6() {
		return nil, fmt.Errorf("forward config: IPv6Network %s is not IPv6", cfg.IPv6Network)
	}
	cfg.Network, cfg.IPv6Network = cfg.Network.Masked(), cfg.IPv6Network.Masked()
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = CheckInterval
	}
	if cfg.Resync <= 0 {
		cfg.Resync = Resync
	}
	log = log.With("component", "forward")
	return &Forwarder{cfg: cfg, log: log, ready: make(chan struct{}), tools: newToolbox(log), programmed: map[string]bool{}}, nil
}

// Ready is closed once the first pass is done: the rules written (or
// removed) in every backend in use, and Flannel's leftovers removed.
func (f *Forwarder) Ready() <-chan struct{} { return f.ready }

// Repairs counts the times Run rewrote rules that had been removed or
// changed after weft had programmed them.
func (f *Forwarder) Repairs() uint64 { return f.repairs.Load() }

// Run programs (or, with Accept off, removes) the rules, removes Flannel's
// leftovers, and with Accept on checks and repairs the rules until ctx is
// done: after every nftables transaction that touched a table named filter
// (as the kernel notifies it) and every Resync, and those of iptables-legacy
// every CheckInterval. It leaves the rules in place on return.
//
// flanneld's forward chain goes once weft's accepts are in (with Accept
// off, at once), so that no packet meets neither; its nat chain and
// nftables tables once NATReady is closed as well.
func (f *Forwarder) Run(ctx context.Context) error {
	var tick, resync <-chan time.Time
	var changed <-chan struct{}
	if f.cfg.Accept {
		t := time.NewTicker(f.cfg.CheckInterval)
		defer t.Stop()
		r := time.NewTicker(f.cfg.Resync)
		defer r.Stop()
		tick, resync = t.C, r.C
		c, stop, err := f.watch(ctx)
		if err != nil {
			return err
		}
		defer stop()
		changed = c
	} else if err := f.removeOwn(); err != nil {
		f.log.Warn("cannot remove weft's forward rules", "err", err)
	}
	nat := f.cfg.NATReady
	if nat == nil {
		closed := make(chan struct{})
		close(closed)
		nat = closed
	}
	filterDone, natDone := false, false
	kinds := []string{legacy, nft}
	for {
		ok := true
		if f.cfg.Accept {
			if err := f.ensure(kinds...); err != nil {
				f.log.Warn("forward accept rules not in place; retrying", "err", err)
				ok = false
			}
		}
		var natWait <-chan struct{}
		if ok {
			f.once.Do(func() { close(f.ready) })
			if !filterDone {
				if err := f.removeFlannel("filter"); err != nil {
					f.log.Warn("cannot remove flanneld's leftover forward rules", "err", err)
				}
				filterDone = true
			}
			if !natDone {
				select {
				case <-nat:
					if err := f.removeFlannel("nat"); err != nil {
						f.log.Warn("cannot remove flanneld's leftover masquerade rules", "err", err)
					}
					natDone = true
				default:
					natWait = nat
				}
			}
		}
		if !f.cfg.Accept && natDone {
			return nil
		}
		kinds = []string{legacy, nft}
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			kinds = []string{legacy}
		case <-resync:
		case <-changed:
		case <-natWait:
		}
	}
}

// watch subscribes to the nftables notifications of the calling thread's
// namespace (the one Run programs): changed has a value after each
// transaction that touched a filter table. stop ends the subscription.
func (f *Forwarder) watch(ctx context.Context) (changed <-chan struct{}, stop func(), err error) {
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open this namespace: %w", err)
	}
	c := make(chan struct{}, 1)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The watch subscribes again from other threads: it names this
		// namespace by the descriptor.
		nftw.WatchTables(wctx, fmt.Sprintf("/proc/self/fd/%d", fd), []string{"filter"}, f.log, c)
	}()
	return c, func() { cancel(); <-done; unix.Close(fd) }, nil
}

// families are the (IPv4, IPv6) networks to accept, with their family.
func (f *Forwarder) families() []netip.Prefix {
	var out []netip.Prefix
	for _, n := range []netip.Prefix{f.cfg.Network, f.cfg.IPv6Network} {
		if n.IsValid() {
			out = append(out, n)
		}
	}
	return out
}

// ensure checks weft's chain and jump in every backend of kinds in use and rewrites
// what differs. A rewrite counts as a repair when this Run had programmed
// that binary's rules before or found them in place (not for a backend that
// just came into use).
func (f *Forwarder) ensure(kinds ...string) error {
	var errs []error
	for _, n := range f.families() {
		for _, t := range f.tools.inUseOf(familyOf(n), "filter", kinds...) {
			why, err := t.check(n)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if why == "" {
				// In place (also as an earlier weftd left them): a
				// later rewrite is a repair.
				f.programmed[t.String()] = true
				continue
			}
			if err := t.program(n); err != nil {
				errs = append(errs, err)
				continue
			}
			if f.programmed[t.String()] {
				f.repairs.Add(1)
				f.log.Warn("repaired forward accept rules", "iptables", t.String(), "reason", why)
			} else {
				f.log.Info("programmed forward accept rules", "iptables", t.String(), "chain", Chain, "network", n, "reason", why)
				f.programmed[t.String()] = true
			}
		}
	}
	return errors.Join(errs...)
}

// Rules are weft's chain as `iptables -S WEFT-FWD` prints it (which omits
// a match on a /0).
func Rules(n netip.Prefix) []string {
	src, dst := " -s "+n.String(), " -d "+n.String()
	if n.Bits() == 0 {
		src, dst = "", ""
	}
	return []string{
		"-N " + Chain,
		"-A " + Chain + src + " -j ACCEPT",
		"-A " + Chain + dst + " -j ACCEPT",
	}
}

// Jump is the rule of FORWARD that jumps to weft's chain, as `iptables -S
// FORWARD` prints it.
const Jump = "-A FORWARD -j " + Chain

// removeOwn deletes weft's jumps and chain from every backend in use.
func (f *Forwarder) removeOwn() error {
	var errs []error
	for _, n := range f.families() {
		for _, t := range f.tools.inUse(familyOf(n), "filter") {
			removed, err := t.removeChain("filter", "FORWARD", Chain)
			if err != nil {
				errs = append(errs, err)
			}
			if removed {
				f.log.Info("removed weft's forward accept rules (--iptables-forward-rules=false)", "iptables", t.String(), "chain", Chain)
			}
		}
	}
	return errors.Join(errs...)
}
