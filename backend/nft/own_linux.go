package nft

import (
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// Counted adds up the packets counted by the rules of table inet name's
// chains (all of them with chains nil) whose comment reasons names, by
// reason, in the namespace at netns ("" for the current one). A missing
// table or chain counts nothing and is no error.
func Counted(netns, name string, chains []string, reasons map[string]string) (map[string]uint64, error) {
	conn, done, err := Dial(netns)
	if err != nil {
		return nil, err
	}
	defer done()
	t := &nftables.Table{Name: name, Family: nftables.TableFamilyINet}
	if chains == nil {
		all, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
		if err != nil {
			return nil, fmt.Errorf("read table inet %s: %w", name, err)
		}
		for _, c := range all {
			if c.Table.Name == name {
				chains = append(chains, c.Name)
			}
		}
	}
	out := map[string]uint64{}
	for _, chain := range chains {
		rules, err := conn.GetRules(t, &nftables.Chain{Name: chain, Table: t})
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read table inet %s: %w", name, err)
		}
		for _, r := range rules {
			c, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			reason, ok := reasons[c]
			if !ok {
				continue
			}
			for _, e := range r.Exprs {
				if n, ok := e.(*expr.Counter); ok {
					out[reason] += n.Packets
				}
			}
		}
	}
	return out, nil
}

// Remove deletes table inet name from the namespace at netns ("" for the
// current one). A missing table, or a kernel without nf_tables, is no
// error.
func Remove(netns, name string) error {
	conn, done, err := Dial(netns)
	if err != nil {
		return err
	}
	defer done()
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if Missing(err) {
		return nil // no nf_tables: no table either
	}
	if err != nil {
		return fmt.Errorf("list nftables tables: %w", err)
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == name }) {
		return nil
	}
	conn.DelTable(&nftables.Table{Name: name, Family: nftables.TableFamilyINet})
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("delete table inet %s: %w", name, err)
	}
	return nil
}
