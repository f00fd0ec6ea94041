package doctor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The kernel's x_tables interface, which iptables-legacy uses: getsockopt
// on a raw IPv4 socket returns a table's hooks and its rules as a blob of
// struct ipt_entry (linux/netfilter_ipv4/ip_tables.h). nftables does not
// show these tables, so the FORWARD policy of iptables-legacy's filter
// table is read here.
const (
	iptSoGetInfo    = 64 // IPT_SO_GET_INFO
	iptSoGetEntries = 65 // IPT_SO_GET_ENTRIES
	hookForward     = 2  // NF_INET_FORWARD
	iptInfoLen      = 84 // sizeof(struct ipt_getinfo)
	iptEntriesHdr   = 40 // offsetof(struct ipt_get_entries, entrytable)
	iptEntryLen     = 112
	verdictAccept   = -2 // -NF_ACCEPT - 1
	verdictDrop     = -1 // -NF_DROP - 1
)

// legacyChain is a built-in chain of an iptables-legacy table: its policy
// and whether an unconditional rule accepts the whole network.
type legacyChain struct {
	policy  string // ACCEPT or DROP
	accepts bool
}

// legacyForward reads the FORWARD chain of iptables-legacy's filter table
// in the current namespace. Call it only when /proc/net/ip_tables_names
// lists filter: asking the kernel for a table creates it.
func legacyForward(network netip.Prefix) (legacyChain, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	if err != nil {
		return legacyChain{}, fmt.Errorf("raw socket: %w", err)
	}
	defer unix.Close(fd)
	info := make([]byte, iptInfoLen)
	copy(info, "filter")
	if err := getsockopt(fd, iptSoGetInfo, info); err != nil {
		return legacyChain{}, fmt.Errorf("IPT_SO_GET_INFO filter: %w", err)
	}
	le := binary.NativeEndian
	hook := le.Uint32(info[36+4*hookForward:])
	underflow := le.Uint32(info[56+4*hookForward:])
	size := le.Uint32(info[80:])
	buf := make([]byte, iptEntriesHdr+int(size))
	copy(buf, "filter")
	le.PutUint32(buf[32:], size)
	if err := getsockopt(fd, iptSoGetEntries, buf); err != nil {
		return legacyChain{}, fmt.Errorf("IPT_SO_GET_ENTRIES filter: %w", err)
	}
	return parseForward(buf[iptEntriesHdr:], hook, underflow, network)
}

func getsockopt(fd, opt int, buf []byte) error {
	n := uint32(len(buf))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_IP, uintptr(opt),
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// parseForward walks the chain's entries from its hook entry to its
// underflow (the policy rule).
func parseForward(entries []byte, hook, underflow uint32, network netip.Prefix) (legacyChain, error) {
	var c legacyChain
	for off := hook; ; {
		e, err := entryAt(entries, off)
		if err != nil {
			return c, err
		}
		if off == underflow {
			switch e.verdict {
			case verdictAccept:
				c.policy = "ACCEPT"
			case verdictDrop:
				c.policy = "DROP"
			default:
				return c, fmt.Errorf("FORWARD policy: verdict %d", e.verdict)
			}
			return c, nil
		}
		c.accepts = c.accepts || e.acceptsAll(network)
		if e.unconditionalJump() { // weft's -j WEFT-FWD, Flannel's -j FLANNEL-FWD
			a, err := chainAccepts(entries, uint32(e.verdict), network)
			if err != nil {
				return c, err
			}
			c.accepts = c.accepts || a
		}
		off += uint32(e.next)
	}
}

// verdictReturn ends a user chain: XT_RETURN, -NF_REPEAT - 1.
const verdictReturn = -5

// chainAccepts reports whether a rule of the user chain at off accepts the
// whole network; it walks the chain up to its closing RETURN.
func chainAccepts(entries []byte, off uint32, network netip.Prefix) (bool, error) {
	for {
		e, err := entryAt(entries, off)
		if err != nil {
			return false, err
		}
		if e.acceptsAll(network) {
			return true, nil
		}
		if e.standard && e.verdict == verdictReturn && e.unconditional() {
			return false, nil
		}
		off += uint32(e.next)
	}
}

// entry is what the check needs of one struct ipt_entry.
type entry struct {
	src, smsk, dst, dmsk [4]byte
	ifaces               bool // an input or output interface is matched
	proto                uint16
	invflags             uint8
	matches              bool // match extensions precede the target
	standard             bool // the target is the standard one (a verdict or a jump)
	verdict              int32
	next                 uint16
}

func entryAt(b []byte, off uint32) (entry, error) {
	if int(off)+iptEntryLen > len(b) {
		return entry{}, errors.New("rule blob truncated")
	}
	r := b[off:]
	le := binary.NativeEndian
	var e entry
	copy(e.src[:], r[0:4])
	copy(e.dst[:], r[4:8])
	copy(e.smsk[:], r[8:12])
	copy(e.dmsk[:], r[12:16])
	for _, x := range r[48:80] { // iniface_mask, outiface_mask
		e.ifaces = e.ifaces || x != 0
	}
	e.proto, e.invflags = le.Uint16(r[80:]), r[83]
	tOff := le.Uint16(r[88:])
	e.next = le.Uint16(r[90:])
	e.matches = tOff > iptEntryLen
	if e.next == 0 || int(tOff)+36 > len(r) {
		return entry{}, errors.New("malformed rule")
	}
	t := r[tOff:]
	e.standard = t[2] == 0 // XT_STANDARD_TARGET is ""
	e.verdict = int32(le.Uint32(t[32:]))
	return e, nil
}

// acceptsAll reports whether the rule accepts every packet from (or to)
// the network: no interface, protocol or match condition, a source prefix
// that covers it and any destination (or the other way round).
func (e entry) acceptsAll(network netip.Prefix) bool {
	if !e.standard || e.verdict != verdictAccept || e.ifaces || e.proto != 0 || e.invflags != 0 || e.matches {
		return false
	}
	return e.coversEither(network)
}

// unconditional reports whether the rule matches every packet.
func (e entry) unconditional() bool {
	return !e.ifaces && e.proto == 0 && e.invflags == 0 && !e.matches && e.smsk == [4]byte{} && e.dmsk == [4]byte{}
}

// unconditionalJump reports whether the rule jumps to a user chain (a
// standard target whose verdict is the chain's offset) for every packet.
func (e entry) unconditionalJump() bool { return e.standard && e.verdict >= 0 && e.unconditional() }

func (e entry) coversEither(network netip.Prefix) bool {
	return covers(e.src, e.smsk, network) && e.dmsk == [4]byte{} || covers(e.dst, e.dmsk, network) && e.smsk == [4]byte{}
}

func covers(addr, mask [4]byte, network netip.Prefix) bool {
	bits := 0
	for _, m := range mask {
		for ; m != 0; m <<= 1 {
			bits++
		}
	}
	p, err := netip.AddrFrom4(addr).Prefix(bits)
	return err == nil && network.Addr().Is4() && bits <= network.Bits() && p.Contains(network.Addr())
}

// checkLegacyForward reports iptables-legacy's FORWARD policy when its
// filter table is loaded in the node's namespace.
func checkLegacyForward(s *state, tables string) {
	if !strings.Contains(" "+strings.Join(strings.Fields(tables), " ")+" ", " filter ") {
		return
	}
	network := netip.Prefix{}
	name := "the cluster network"
	if s.Config != nil {
		network, name = s.Config.Network, s.Config.Network.String()
	}
	var c legacyChain
	err := s.Do.Run(func() (err error) { c, err = legacyForward(network); return err })
	const where = "iptables-legacy table filter chain FORWARD"
	switch {
	case err != nil:
		s.r.add("firewall/forward-legacy", Warn, "check it with `iptables-legacy -S FORWARD`", "read %s: %v", where, err)
	case c.policy == "DROP" && c.accepts:
		s.r.ok("firewall/forward-legacy", "%s has policy DROP but a rule accepts %s", where, name)
	case c.policy == "DROP":
		s.r.add("firewall/forward-legacy", Fail,
			fmt.Sprintf("run weftd with --iptables-forward-rules (the default), with iptables-legacy on its PATH: it keeps chain WEFT-FWD accepting %s here; "+
				"or iptables-legacy -I FORWARD -s %s -j ACCEPT; iptables-legacy -I FORWARD -d %s -j ACCEPT", name, name, name),
			"%s has policy DROP and no rule accepting %s: forwarded pod traffic is dropped there, whatever nftables accepts", where, name)
	default:
		s.r.ok("firewall/forward-legacy", "%s has policy %s", where, c.policy)
	}
}
