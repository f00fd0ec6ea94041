package forward

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"

	"github.com/coreos/go-iptables/iptables"
	"github.com/google/nftables"
)

// family is an address family: 4 or 6.
type family int

func familyOf(n netip.Prefix) family {
	if n.Addr().Is6() {
		return 6
	}
	return 4
}

// The iptables backends: the kernel's x_tables (iptables-legacy) and
// nftables (iptables-nft).
const (
	legacy = "legacy"
	nft    = "nft"
)

// legacyTables is iptables-legacy's tables of one family, written by its
// binary (iptables-legacy or ip6tables-legacy) through go-iptables: the
// kernel takes them only as the x_tables blob of a whole table, which the
// binary builds.
type legacyTables struct {
	name string // the binary
	ipt  *iptables.IPTables
}

var _ backend = (*legacyTables)(nil)

func (t *legacyTables) String() string { return t.name }

// toolbox finds the iptables backends in use, and the iptables-legacy
// binaries. It remembers the binaries it found, and which missing ones it
// has already logged.
type toolbox struct {
	log    *slog.Logger
	mu     sync.Mutex
	tools  map[string]*legacyTables
	warned map[string]bool
	// procNet is where the kernel lists the iptables-legacy tables of the
	// calling thread's namespace.
	procNet string
}

func newToolbox(log *slog.Logger) *toolbox {
	return &toolbox{log: log, tools: map[string]*legacyTables{}, warned: map[string]bool{}, procNet: "/proc/thread-self/net"}
}

func binary(kind string, f family) string {
	if f == 6 {
		return "ip6tables-" + kind
	}
	return "iptables-" + kind
}

// inUse returns the iptables backends of family f that hold table: for
// legacy, the table is loaded in this namespace; for nft, nftables has the
// table with its built-in chain (FORWARD for filter, POSTROUTING for nat).
// iptables-legacy in use without its binary is logged once and left out.
func (b *toolbox) inUse(f family, table string) []backend {
	return b.inUseOf(f, table, legacy, nft)
}

// inUseOf is inUse among the backends of the kinds named.
func (b *toolbox) inUseOf(f family, table string, kinds ...string) []backend {
	var out []backend
	for _, kind := range kinds {
		used, err := b.used(kind, f, table)
		if err != nil {
			b.warnOnce("check:"+binary(kind, f)+table, "cannot tell whether "+binary(kind, f)+" is in use", "err", err)
			continue
		}
		if !used {
			continue
		}
		if kind == nft {
			out = append(out, nftTables{f})
		} else if t := b.legacy(f); t != nil {
			out = append(out, t)
		}
	}
	return out
}

func (b *toolbox) used(kind string, f family, table string) (bool, error) {
	if kind == legacy {
		name := "ip_tables_names"
		if f == 6 {
			name = "ip6_tables_names"
		}
		data, err := os.ReadFile(b.procNet + "/" + name)
		if errors.Is(err, os.ErrNotExist) { // ip_tables not loaded: no legacy table at all
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return slices.Contains(strings.Fields(string(data)), table), nil
	}
	conn, err := nftables.New()
	if err != nil {
		return false, fmt.Errorf("nftables connection: %w", err)
	}
	chains, err := nftTables{f}.chains(conn, table)
	if err != nil {
		return false, err
	}
	return chains[builtin(table)] != nil, nil
}

func builtin(table string) string {
	if table == "nat" {
		return "POSTROUTING"
	}
	return "FORWARD"
}

// legacy returns iptables-legacy of family f, or nil (logged once) when
// its binary is missing.
func (b *toolbox) legacy(f family) *legacyTables {
	name := binary(legacy, f)
	b.mu.Lock()
	defer b.mu.Unlock()
	if t := b.tools[name]; t != nil {
		return t
	}
	path, err := exec.LookPath(name)
	if err != nil {
		b.warnLocked("missing:"+name, "iptables-legacy is in use but its binary is not on PATH: weft cannot write its rules there",
			"binary", name, "err", err)
		return nil
	}
	proto := iptables.ProtocolIPv4
	if f == 6 {
		proto = iptables.ProtocolIPv6
	}
	ipt, err := iptables.New(iptables.Path(path), iptables.IPFamily(proto), iptables.Timeout(5))
	if err != nil {
		b.warnLocked("version:"+name, "cannot run an iptables binary", "binary", path, "err", err)
		return nil
	}
	t := &legacyTables{name: name, ipt: ipt}
	b.tools[name] = t
	return t
}

func (b *toolbox) warnOnce(key, msg string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.warnLocked(key, msg, args...)
}

func (b *toolbox) warnLocked(key, msg string, args ...any) {
	if b.warned[key] {
		return
	}
	b.warned[key] = true
	b.log.Warn(msg, args...)
}

// isMissing reports whether err is iptables' exit status 1, which `-S` on a
// missing chain gives (iptables-nft 1.8.9 then says "incompatible" rather
// than "does not exist").
func isMissing(err error) bool {
	var e *iptables.Error
	return errors.As(err, &e) && e.ExitStatus() == 1
}

// check returns why the rules are not as wanted ("" when they are).
func (t *legacyTables) check(n netip.Prefix) (string, error) {
	have, err := t.ipt.List("filter", Chain)
	if err != nil {
		if isMissing(err) {
			return "chain missing", nil
		}
		return "", fmt.Errorf("%s: list %s: %w", t.name, Chain, err)
	}
	if !slices.Equal(have, Rules(n)) {
		return "rules of " + Chain + " changed", nil
	}
	fwd, err := t.ipt.List("filter", "FORWARD")
	if err != nil {
		return "", fmt.Errorf("%s: list FORWARD: %w", t.name, err)
	}
	switch c := count(fwd, Jump); {
	case c == 0:
		return "jump from FORWARD missing", nil
	case c > 1:
		return "jump from FORWARD duplicated", nil
	}
	return "", nil
}

func count(lines []string, s string) int {
	c := 0
	for _, l := range lines {
		if l == s {
			c++
		}
	}
	return c
}

// program writes weft's chain afresh and leaves exactly one jump to it,
// appended to FORWARD unless one is there already.
func (t *legacyTables) program(n netip.Prefix) error {
	if err := t.ipt.ClearChain("filter", Chain); err != nil {
		return fmt.Errorf("%s: create %s: %w", t.name, Chain, err)
	}
	for _, r := range Rules(n)[1:] {
		if err := t.ipt.Append("filter", Chain, ruleSpec(r)...); err != nil {
			return fmt.Errorf("%s: append to %s: %w", t.name, Chain, err)
		}
	}
	fwd, err := t.ipt.List("filter", "FORWARD")
	if err != nil {
		return fmt.Errorf("%s: list FORWARD: %w", t.name, err)
	}
	for range count(fwd, Jump) - 1 {
		if err := t.ipt.Delete("filter", "FORWARD", "-j", Chain); err != nil {
			return fmt.Errorf("%s: delete a duplicate jump to %s: %w", t.name, Chain, err)
		}
	}
	if count(fwd, Jump) == 0 {
		if err := t.ipt.Append("filter", "FORWARD", "-j", Chain); err != nil {
			return fmt.Errorf("%s: append the jump to %s: %w", t.name, Chain, err)
		}
	}
	return nil
}

// ruleSpec is the rule specification of a line of Rules, without "-A chain".
func ruleSpec(line string) []string {
	return strings.Fields(line)[2:]
}

// removeChain deletes the rules of parent that jump (or go) to chain, then
// chain itself. It reports whether chain existed.
func (t *legacyTables) removeChain(table, parent, chain string) (bool, error) {
	if _, err := t.ipt.List(table, chain); err != nil {
		if isMissing(err) {
			return false, nil
		}
		return false, fmt.Errorf("%s: list %s %s: %w", t.name, table, chain, err)
	}
	rules, err := t.ipt.List(table, parent)
	if err != nil {
		return true, fmt.Errorf("%s: list %s %s: %w", t.name, table, parent, err)
	}
	var ids []int // rule numbers, counted from 1 as iptables does
	n := 0
	for _, r := range rules {
		if !strings.HasPrefix(r, "-A ") {
			continue
		}
		n++
		if targets(r, chain) {
			ids = append(ids, n)
		}
	}
	for _, id := range slices.Backward(ids) {
		if err := t.ipt.DeleteById(table, parent, id); err != nil {
			return true, fmt.Errorf("%s: delete rule %d of %s %s: %w", t.name, id, table, parent, err)
		}
	}
	if err := t.ipt.ClearAndDeleteChain(table, chain); err != nil {
		return true, fmt.Errorf("%s: delete %s %s: %w", t.name, table, chain, err)
	}
	return true, nil
}

// targets reports whether the rule (as `iptables -S` prints it) jumps or
// goes to chain.
func targets(rule, chain string) bool {
	f := strings.Fields(rule)
	for i := 0; i+1 < len(f); i++ {
		if (f[i] == "-j" || f[i] == "-g") && f[i+1] == chain {
			return true
		}
	}
	return false
}
