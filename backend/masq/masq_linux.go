package masq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"

	"github.com/weft-net/weft/backend/nft"
)

// CheckInterval is how often Run checks the tables by default, besides
// after every change the kernel notifies: a safety net for notifications
// lost while the subscription was renewed.
const CheckInterval = 90 * time.Second

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
	// CheckInterval overrides the period of the check that runs besides
	// the one on every notified change (0: CheckInterval).
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

// Run programs the tables, then checks and repairs them after every
// nftables transaction that touched them (as the kernel notifies it) and
// every CheckInterval, until ctx is done. It leaves them in place on return.
func (m *Masq) Run(ctx context.Context) error {
	conn, closeNS, err := nft.Dial(m.cfg.NetNS)
	if err != nil {
		return err
	}
	defer closeNS()
	wctx, stop := context.WithCancel(ctx)
	changed := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		nft.WatchTables(wctx, m.cfg.NetNS, []string{TableIPv4, TableIPv6}, m.log, changed)
	}()
	defer func() { stop(); wg.Wait() }()
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
		case <-changed:
		}
	}
}

// ensure checks each table and rewrites the ones that are not as wanted.
func (m *Masq) ensure(conn *nftables.Conn, programmed bool) error {
	var errs []error
	for _, want := range m.tables() {
		ok, why, err := nft.Check(conn, want)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			continue
		}
		if err := nft.Program(conn, want); err != nil {
			errs = append(errs, err)
			continue
		}
		if programmed {
			m.repairs.Add(1)
			m.log.Warn("repaired masquerade table", "table", want.Name, "reason", why)
		} else {
			m.log.Info("programmed masquerade table", "table", want.Name, "reason", why)
		}
	}
	return errors.Join(errs...)
}

func (m *Masq) tables() []nft.Table {
	var out []nft.Table
	if m.cfg.Network.IsValid() {
		out = append(out, specFor(m.cfg.Network, m.cfg.Subnet, m.cfg.KeepPorts))
	}
	if m.cfg.IPv6Network.IsValid() {
		out = append(out, specFor(m.cfg.IPv6Network, m.cfg.IPv6Subnet, m.cfg.KeepPorts))
	}
	return out
}

// Remove deletes weft's masquerade tables from the namespace at path (""
// for the current one), for a node that runs with masquerading off. Missing
// tables are not an error.
func Remove(path string) error {
	conn, closeNS, err := nft.Dial(path)
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
