package doctor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// legacyNote is what the evidence of firewall/iptables-legacy adds about
// the filter table's FORWARD chain (tables as /proc/net/ip_tables_names
// lists them): its policy, and when it is DROP, that it is a suspect only.
// The kernel's trace does not see x_tables, so doctor cannot tell whether
// a rule there accepts the pods' traffic, and says no more than that.
func legacyNote(s *state, tables []string) string {
	if !strings.Contains(" "+strings.Join(tables, " ")+" ", " filter ") {
		return "" // asking the kernel for a table would load it
	}
	var policy string
	err := s.Do.Run(func() (err error) { policy, err = legacyForwardPolicy(); return err })
	switch {
	case err != nil:
		return fmt.Sprintf("; read filter FORWARD: %v", err)
	case policy == "DROP":
		network := "the cluster network"
		if s.Config != nil {
			network = s.Config.Network.String()
		}
		return fmt.Sprintf("; filter FORWARD has policy DROP, a suspect only: forwarded pod traffic passes it only if a rule there accepts %s "+
			"(weftd with --iptables-forward-rules, the default, and iptables-legacy on its PATH keeps chain WEFT-FWD doing so)", network)
	}
	return "; filter FORWARD has policy " + policy
}

// legacyForwardPolicy reads the policy of iptables-legacy's filter FORWARD
// chain in the current namespace through the kernel's x_tables interface,
// as iptables-legacy does: getsockopt on a raw IPv4 socket gives the
// table's layout (struct ipt_getinfo) and its rules (struct ipt_entry,
// linux/netfilter_ipv4/ip_tables.h); the chain's policy is the verdict of
// the standard target of the entry at the chain's underflow.
func legacyForwardPolicy() (string, error) {
	const (
		soGetInfo, soGetEntries = 64, 65 // IPT_SO_GET_INFO, IPT_SO_GET_ENTRIES
		forward                 = 2      // NF_INET_FORWARD
		entriesHdr              = 40     // offsetof(struct ipt_get_entries, entrytable)
	)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	if err != nil {
		return "", fmt.Errorf("raw socket: %w", err)
	}
	defer unix.Close(fd)
	le := binary.NativeEndian
	info := make([]byte, 84) // sizeof(struct ipt_getinfo)
	copy(info, "filter")
	if err := getsockopt(fd, soGetInfo, info); err != nil {
		return "", fmt.Errorf("IPT_SO_GET_INFO filter: %w", err)
	}
	underflow, size := int(le.Uint32(info[56+4*forward:])), le.Uint32(info[80:])
	buf := make([]byte, entriesHdr+int(size))
	copy(buf, "filter")
	le.PutUint32(buf[32:], size)
	if err := getsockopt(fd, soGetEntries, buf); err != nil {
		return "", fmt.Errorf("IPT_SO_GET_ENTRIES filter: %w", err)
	}
	entries := buf[entriesHdr:]
	if underflow+92 > len(entries) {
		return "", errors.New("rule blob truncated")
	}
	target := underflow + int(le.Uint16(entries[underflow+88:])) // target_offset
	if target+36 > len(entries) {
		return "", errors.New("rule blob truncated")
	}
	switch v := int32(le.Uint32(entries[target+32:])); v { // after struct xt_entry_target
	case -2: // -NF_ACCEPT - 1
		return "ACCEPT", nil
	case -1: // -NF_DROP - 1
		return "DROP", nil
	default:
		return "", fmt.Errorf("FORWARD policy: verdict %d", v)
	}
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
