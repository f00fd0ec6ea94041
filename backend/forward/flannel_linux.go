package forward

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
)

// flannelChains are the iptables chains flanneld writes: table, the
// built-in chain that jumps to it, the chain.
var flannelChains = []struct{ table, parent, chain string }{
	{"filter", "FORWARD", "FLANNEL-FWD"},
	{"nat", "POSTROUTING", "FLANNEL-POSTRTG"},
}

// flannelTables are the nftables tables flanneld writes in nftables mode.
var flannelTables = []*nftables.Table{
	{Name: "flannel-ipv4", Family: nftables.TableFamilyIPv4},
	{Name: "flannel-ipv6", Family: nftables.TableFamilyIPv6},
}

// removeFlannel removes what flanneld left in the calling thread's network
// namespace in table (filter: FLANNEL-FWD; nat: FLANNEL-POSTRTG), the
// chain with the rules that jump to it, in every iptables backend and
// family in use; with nat also its nftables tables, which hold both its
// forward and its masquerade rules. Each removal is logged; nothing left is
// not an error.
func (f *Forwarder) removeFlannel(table string) error {
	b, log := f.tools, f.log
	var errs []error
	for _, fam := range []family{4, 6} {
		for _, c := range flannelChains {
			if c.table != table {
				continue
			}
			for _, t := range b.inUse(fam, c.table) {
				removed, err := t.removeChain(c.table, c.parent, c.chain)
				if err != nil {
					errs = append(errs, err)
				}
				if removed {
					log.Info("removed flanneld's leftover chain", "iptables", t.String(), "table", c.table, "chain", c.chain)
				}
			}
		}
	}
	if table != "nat" {
		return errors.Join(errs...)
	}
	conn, err := nftables.New()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("nftables connection: %w", err))...)
	}
	for _, want := range flannelTables {
		tables, err := conn.ListTablesOfFamily(want.Family)
		if err != nil {
			errs = append(errs, fmt.Errorf("list nftables tables: %w", err))
			continue
		}
		for _, t := range tables {
			if t.Name != want.Name {
				continue
			}
			conn.DelTable(t)
			if err := conn.Flush(); err != nil {
				errs = append(errs, fmt.Errorf("delete nftables table %s: %w", t.Name, err))
				continue
			}
			log.Info("removed flanneld's leftover nftables table", "table", t.Name)
		}
	}
	return errors.Join(errs...)
}
