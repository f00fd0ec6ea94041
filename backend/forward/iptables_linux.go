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

// tool is one iptables binary: a backend and a family.
type tool struct {
	name string // the binary, for example iptables-nft
	ipt  *iptables.IPTables
}

// toolbox finds the iptables binaries and the backends in use. It remembers
// the binaries it found, and which missing ones it has already logged.
type toolbox struct {
	log    *slog.Logger
	mu     sync.Mutex
	tools  map[string]*tool
	warned map[string]bool
	// procNet is where the kernel lists the iptables-legacy tables of the
	// calling thread's namespace.
	procNet string
}

func newToolbox(log *slog.Logger) *toolbox {
	return &toolbox{log: log, tools: map[string]*tool{}, warned: map[string]bool{}, procNet: "/proc/thread-self/net"}
}

func binary(backend string, f family) string {
	if f == 6 {
		return "ip6tables-" + backend
	}
	return "iptables-" + backend
}

// inUse returns the iptables binaries of family f whose backend holds
// table: for legacy, the table is loaded in this namespace; for nft,
// nftables has the table with its built-in chain (FORWARD for filter,
// POSTROUTING for nat). A backend in use whose binary is missing is logged
// once and left out.
func (b *toolbox) inUse(f family, table string) []*tool {
	var out []*tool
	for _, backend := range []string{legacy, nft} {
		used, err := b.used(backend, f, table)
		if err != nil {
			b.warnOnce("check:"+binary(backend, f)+table, "cannot tell whether "+binary(backend, f)+" is in use", "err", err)
			continue
		}
		if !used {
			continue
		}
		if t := b.tool(backend, f); t != nil {
			out = append(out, t)
		}
	}
	return out
}

func (b *toolbox) used(backend string, f family, table string) (bool, error) {
	if backend == legacy {
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
	return nftHasChain(f, table, builtin(table))
}

func builtin(table string) string {
	if table == "nat" {
		return "POSTROUTING"
	}
	return "FORWARD"
}

// nftHasChain reports whether nftables holds the chain in the table of the
// family (ip or ip6), as iptables-nft writes them.
func nftHasChain(f family, table, chain string) (bool, error) {
	conn, err := nftables.New()
	if err != nil {
		return false, fmt.Errorf("nftables connection: %w", err)
	}
	fam := nftables.TableFamilyIPv4
	if f == 6 {
		fam = nftables.TableFamilyIPv6
	}
	chains, err := conn.ListChainsOfTableFamily(fam)
	if err != nil {
		return false, fmt.Errorf("list nftables chains: %w", err)
	}
	return slices.ContainsFunc(chains, func(c *nftables.Chain) bool { return c.Table.Name == table && c.Name == chain }), nil
}

// tool returns the binary of the backend and family, or nil (logged once)
// when it is missing.
func (b *toolbox) tool(backend string, f family) *tool {
	name := binary(backend, f)
	b.mu.Lock()
	defer b.mu.Unlock()
	if t := b.tools[name]; t != nil {
		return t
	}
	path, err := exec.LookPath(name)
	if err != nil {
		b.warnLocked("missing:"+name, "an iptables backend is in use but its binary is not on PATH: weft cannot write its rules there",
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
	t := &tool{name: name, ipt: ipt}
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

// removeChain deletes the rules of parent that jump (or go) to chain, then
// chain itself. It reports whether chain existed.
func removeChain(t *tool, table, parent, chain string) (bool, error) {
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
