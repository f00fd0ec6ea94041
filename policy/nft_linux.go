package policy

import (
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// This file writes the policy tables: one nftables transaction per change,
// on a connection to the node's namespace. rules_linux.go builds the inet
// table's chains, sets and rules, bridge_linux.go the bridge table.

// Table is the nftables table (family inet: IPv4 and IPv6) that holds the
// policy rules.
const Table = "weft-policy"

// DefaultBridge is the pod bridge of a plan that names none: the CNI
// plugin's default.
const DefaultBridge = "cni0"

// ErrNoSourceChecks says that Program committed the inet table but not
// the bridge table of the source checks, which the kernel refused (as one
// without nftables' bridge family, CONFIG_NF_TABLES_BRIDGE, does): policy
// is enforced, but not the checks of that table.
var ErrNoSourceChecks = errors.New("bridge table refused: pods' source addresses, and broadcasts to pods isolated for ingress, are not checked")

// Program replaces the policy table in the namespace at netns ("" for the
// current one) by the one plans describe (at most one plan per family), in
// one nftables transaction: the kernel switches from the old rules to the
// new ones at once; when a plan lists pods' bridge ports, the bridge table
// of their source checks (buildAntiSpoof) is replaced in the same
// transaction. If the kernel refuses that transaction but takes the inet
// table alone, Program commits the inet table alone and returns an error
// wrapping ErrNoSourceChecks. While a pod is isolated, IPv6 packets with a
// link-local source or destination that the pod bridge forwards (pods of
// one node bridging to each other through br_netfilter) are dropped,
// except neighbour discovery; other bridges of the node are not touched.
func Program(netns string, plans ...Plan) error {
	if len(plans) > 2 || len(plans) == 2 && plans[0].V6 == plans[1].V6 {
		return errors.New("program network policy: more than one plan of a family")
	}
	// Only with ports: a node run without the address store needs no
	// bridge table to enforce the rest. A table left with no ports
	// listed stays: its entries name veths that are gone.
	withBridge := slices.ContainsFunc(plans, func(p Plan) bool { return len(p.Ports) > 0 })
	err := program(netns, plans, withBridge)
	if err == nil || !withBridge {
		return err
	}
	if errInet := program(netns, plans, false); errInet != nil {
		return err // the inet table is refused too: the first error says why
	}
	// A bridge table of an earlier commit would go on applying old ports
	// and isolation: it goes, where the kernel lets it.
	if derr := delBridge(netns); derr != nil {
		return fmt.Errorf("%w: %w (and an earlier bridge table may be left in place: %w)", ErrNoSourceChecks, err, derr)
	}
	return fmt.Errorf("%w: %w", ErrNoSourceChecks, err)
}

// delBridge deletes the bridge table, if there is one.
func delBridge(netns string) error {
	conn, closeNS, err := dial(netns)
	if err != nil {
		return err
	}
	defer closeNS()
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyBridge)
	if err != nil {
		return nil // no bridge family: no table of it either
	}
	for _, t := range tables {
		if t.Name == Table {
			conn.DelTable(t)
			return conn.Flush()
		}
	}
	return nil
}

// program writes the inet table of plans and, if withBridge, their bridge
// table, in one transaction.
func program(netns string, plans []Plan, withBridge bool) error {
	conn, closeNS, err := dial(netns)
	if err != nil {
		return err
	}
	defer closeNS()
	t := &nftables.Table{Name: Table, Family: nftables.TableFamilyINet}
	conn.AddTable(t) // so that the delete below finds it
	conn.DelTable(t)
	conn.AddTable(t)
	if err := build(conn, t, plans); err != nil {
		return err
	}
	if withBridge {
		bt := &nftables.Table{Name: Table, Family: nftables.TableFamilyBridge}
		conn.AddTable(bt)
		conn.DelTable(bt)
		conn.AddTable(bt)
		if err := buildAntiSpoof(conn, bt, plans); err != nil {
			return err
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("program nftables table %s: %w", Table, err)
	}
	return nil
}

// Remove deletes the policy tables, if they are there.
func Remove(netns string) error {
	conn, closeNS, err := dial(netns)
	if err != nil {
		return err
	}
	defer closeNS()
	// One transaction each: a kernel without the bridge family refuses
	// that one only.
	var errs []error
	for _, f := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
		t := &nftables.Table{Name: Table, Family: f}
		conn.AddTable(t)
		conn.DelTable(t)
		if err := conn.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("remove nftables table %s (family %d): %w", Table, f, err))
		}
	}
	return errors.Join(errs...)
}

// sendBuffer is the socket buffer size (send and receive) of the nftables
// connection: one transaction goes in one sendmsg, which the default
// buffer (wmem_default, about 200 KiB) limits to some thousand pods, and
// the kernel's answers to it come back at once; nft(8) raises both too.
const sendBuffer = 64 << 20

func bigBuffer(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("nftables socket: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendBuffer),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, sendBuffer))
	}); err != nil {
		return fmt.Errorf("nftables socket: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("nftables socket send buffer: %w", serr)
	}
	return nil
}

// dial returns an nftables connection to the namespace at path ("" for the
// current one) and the function that releases it.
func dial(path string) (*nftables.Conn, func(), error) {
	buf := nftables.WithSockOptions(bigBuffer)
	if path == "" {
		c, err := nftables.New(buf)
		if err != nil {
			return nil, nil, fmt.Errorf("nftables connection: %w", err)
		}
		return c, func() {}, nil
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open namespace %s: %w", path, err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(fd), buf)
	if err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("nftables connection in %s: %w", path, err)
	}
	return c, func() { unix.Close(fd) }, nil
}
