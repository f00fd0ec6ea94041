package masq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// CheckInterval is how often Run checks the tables by default.
const CheckInterval = 5 * time.Second

// Table names.
const (
	TableIPv4 = "weft-ipv4"
	TableIPv6 = "weft-ipv6"
)

// Config says which namespace and which cluster networks to masquerade for.
type Config struct {
	// NetNS is the path of the network namespace to program (for example
	// /run/netns/x); empty means the namespace weftd runs in.
	NetNS string
	// Network and IPv6Network are the cluster networks; an unset one gets
	// no table. At least one is required.
	Network, IPv6Network netip.Prefix
	// Subnet and IPv6Subnet are this node's pod subnets, inside Network
	// and IPv6Network: traffic to them from outside the cluster network
	// keeps its source. An unset one gets no such rule.
	Subnet, IPv6Subnet netip.Prefix
	// KeepPorts masquerades without fully-random ports, so that a flow
	// keeps its source port when no other flow holds it (flanneld's
	// --ip-masq-fully-random-disable, for NAT traversal such as Tailscale's
	// from pods).
	KeepPorts bool
	// CheckInterval overrides the period of the check (0: CheckInterval).
	CheckInterval time.Duration
}

// Masq keeps weft's masquerade tables in place.
type Masq struct {
	cfg     Config
	log     *slog.Logger
	ready   chan struct{}
	once    sync.Once
	repairs atomic.Uint64
}

// New validates cfg; nothing is programmed until Run.
func New(cfg Config, log *slog.Logger) (*Masq, error) {
	if !cfg.Network.IsValid() && !cfg.IPv6Network.IsValid() {
		return nil, errors.New("masq config: no cluster network")
	}
	if cfg.Network.IsValid() && !cfg.Network.Addr().Is4() {
		return nil, fmt.Errorf("masq config: Network %s is not IPv4", cfg.Network)
	}
	if cfg.IPv6Network.IsValid() && !cfg.IPv6Network.Addr().Is6() {
		return nil, fmt.Errorf("masq config: IPv6Network %s is not IPv6", cfg.IPv6Network)
	}
	if cfg.Subnet.IsValid() && (!cfg.Network.IsValid() || !cfg.Network.Contains(cfg.Subnet.Addr()) || cfg.Subnet.Bits() < cfg.Network.Bits()) {
		return nil, fmt.Errorf("masq config: Subnet %s is not inside Network %s", cfg.Subnet, cfg.Network)
	}
	if cfg.IPv6Subnet.IsValid() && (!cfg.IPv6Network.IsValid() || !cfg.IPv6Network.Contains(cfg.IPv6Subnet.Addr()) || cfg.IPv6Subnet.Bits() < cfg.IPv6Network.Bits()) {
		return nil, fmt.Errorf("masq config: IPv6Subnet %s is not inside IPv6Network %s", cfg.IPv6Subnet, cfg.IPv6Network)
	}
	cfg.Network, cfg.IPv6Network = cfg.Network.Masked(), cfg.IPv6Network.Masked()
	cfg.Subnet, cfg.IPv6Subnet = cfg.Subnet.Masked(), cfg.IPv6Subnet.Masked()
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = CheckInterval
	}
	return &Masq{cfg: cfg, log: log.With("component", "masq"), ready: make(chan struct{})}, nil
}

// Ready is closed once the tables have been programmed the first time.
func (m *Masq) Ready() <-chan struct{} { return m.ready }

// Repairs counts the times Run rewrote a table that had been removed or
// changed after weft had programmed it.
func (m *Masq) Repairs() uint64 { return m.repairs.Load() }

// Run programs the tables, then checks and repairs them every
// CheckInterval until ctx is done. It leaves them in place on return.
func (m *Masq) Run(ctx context.Context) error {
	conn, closeNS, err := dial(m.cfg.NetNS)
	if err != nil {
		return err
	}
	defer closeNS()
	tick := time.NewTicker(m.cfg.CheckInterval)
	defer tick.Stop()
	programmed := false
	for {
		if err := m.ensure(conn, programmed); err != nil {
			m.log.Warn("masquerade rules not in place; retrying", "err", err)
		} else {
			programmed = true
			m.once.Do(func() { close(m.ready) })
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// ensure checks each table and rewrites the ones that are not as wanted.
func (m *Masq) ensure(conn *nftables.Conn, programmed bool) error {
	var errs []error
	for _, want := range m.tables() {
		ok, why, err := check(conn, want)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			continue
		}
		if err := program(conn, want); err != nil {
			errs = append(errs, err)
			continue
		}
		if programmed {
			m.repairs.Add(1)
			m.log.Warn("repaired masquerade table", "table", want.name, "reason", why)
		} else {
			m.log.Info("programmed masquerade table", "table", want.name, "reason", why)
		}
	}
	return errors.Join(errs...)
}

func (m *Masq) tables() []tableSpec {
	var out []tableSpec
	if m.cfg.Network.IsValid() {
		out = append(out, specFor(m.cfg.Network, m.cfg.Subnet, m.cfg.KeepPorts))
	}
	if m.cfg.IPv6Network.IsValid() {
		out = append(out, specFor(m.cfg.IPv6Network, m.cfg.IPv6Subnet, m.cfg.KeepPorts))
	}
	return out
}

// dial returns an nftables connection to the namespace at path ("" for the
// current one) and the function that releases it.
func dial(path string) (*nftables.Conn, func(), error) {
	if path == "" {
		c, err := nftables.New()
		if err != nil {
			return nil, nil, fmt.Errorf("nftables connection: %w", err)
		}
		return c, func() {}, nil
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open namespace %s: %w", path, err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("nftables connection in %s: %w", path, err)
	}
	return c, func() { unix.Close(fd) }, nil
}

// check reports whether the table is exactly as wanted, and if not why.
func check(conn *nftables.Conn, want tableSpec) (bool, string, error) {
	tables, err := conn.ListTablesOfFamily(want.family)
	if err != nil {
		return false, "", fmt.Errorf("list nftables tables: %w", err)
	}
	var t *nftables.Table
	for _, x := range tables {
		if x.Name == want.name {
			t = x
		}
	}
	if t == nil {
		return false, "table missing", nil
	}
	chains, err := conn.ListChainsOfTableFamily(want.family)
	if err != nil {
		return false, "", fmt.Errorf("list nftables chains: %w", err)
	}
	n := 0
	for _, c := range chains {
		if c.Table.Name != want.name {
			continue
		}
		n++
		wc := want.chain(c.Name)
		if wc == nil || !sameHook(c, wc) {
			return false, "chain " + c.Name + " not weft's", nil
		}
		rules, err := conn.GetRules(t, c)
		if err != nil {
			return false, "", fmt.Errorf("list rules of %s %s: %w", want.name, c.Name, err)
		}
		if !sameRules(rules, wc.rules) {
			return false, "rules of chain " + c.Name + " changed", nil
		}
	}
	if n != len(want.chains) {
		return false, "chain missing", nil
	}
	return true, "", nil
}

// sameRules reports whether the kernel's rules are exactly the wanted ones:
// same comments and same expressions, in order.
func sameRules(have []*nftables.Rule, want []ruleSpec) bool {
	if len(have) != len(want) {
		return false
	}
	for i, r := range have {
		c, _ := userdata.GetString(r.UserData, userdata.TypeComment)
		if c != want[i].comment || !reflect.DeepEqual(r.Exprs, want[i].exprs) {
			return false
		}
	}
	return true
}

func sameHook(c *nftables.Chain, w *chainSpec) bool {
	return c.Type == w.typ && c.Hooknum != nil && *c.Hooknum == *w.hook &&
		c.Priority != nil && *c.Priority == *w.priority &&
		(c.Policy == nil || *c.Policy == nftables.ChainPolicyAccept)
}

// program replaces the table in one transaction: add (a no-op if it
// exists), delete, then create it anew with its chains and rules.
func program(conn *nftables.Conn, want tableSpec) error {
	t := &nftables.Table{Name: want.name, Family: want.family}
	conn.AddTable(t)
	conn.DelTable(t)
	conn.AddTable(t)
	for _, cs := range want.chains {
		policy := nftables.ChainPolicyAccept
		c := conn.AddChain(&nftables.Chain{
			Name: cs.name, Table: t, Type: cs.typ, Hooknum: cs.hook, Priority: cs.priority, Policy: &policy,
		})
		for _, r := range cs.rules {
			conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: r.exprs, UserData: comment(r.comment)})
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("program nftables table %s: %w", want.name, err)
	}
	return nil
}

// Remove deletes weft's masquerade tables from the namespace at path (""
// for the current one), for a node that runs with masquerading off. Missing
// tables are not an error.
func Remove(path string) error {
	conn, closeNS, err := dial(path)
	if err != nil {
		return err
	}
	defer closeNS()
	for _, t := range []*nftables.Table{
		{Name: TableIPv4, Family: nftables.TableFamilyIPv4},
		{Name: TableIPv6, Family: nftables.TableFamilyIPv6},
	} {
		conn.AddTable(t) // so that the delete cannot fail on a missing table
		conn.DelTable(t)
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("delete masquerade tables: %w", err)
	}
	return nil
}
