package lab

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Backend choices for the lab's nodes.
const (
	BackendVXLAN  = "vxlan"
	BackendUVXLAN = "uvxlan"
	BackendMixed  = "mixed" // odd nodes vxlan, even nodes uvxlan
)

// Options describe a lab. Zero values take the defaults shown, except
// Nodes and PodsPerNode, which are taken as given: zero nodes is refused,
// zero pods per node is a lab of bare nodes.
type Options struct {
	StateDir    string       // DefaultStateDir
	Nodes       int          // at least 1
	PodsPerNode int          // 0..50
	Backend     string       // BackendVXLAN
	NoFastPath  bool         // uvxlan nodes run without the fast path ("FastPath": false in the network config; weft's default is on)
	Weftd       string       // path of weftd; see FindBinaries
	CNIBin      string       // directory holding the weft plugin; see FindBinaries
	Network     netip.Prefix // 10.244.0.0/16
	Underlay    netip.Prefix // 192.168.77.0/24
	MTU         int          // underlay MTU, 1500
	EtcdPrefix  string       // /coreos.com/network
	Timeout     time.Duration
	Log         *slog.Logger
	Out         io.Writer // where Up prints its report; os.Stdout
}

func (o Options) withDefaults() (Options, error) {
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	abs, err := filepath.Abs(o.StateDir)
	if err != nil {
		return o, fmt.Errorf("state dir: %w", err)
	}
	o.StateDir = abs
	if o.Backend == "" {
		o.Backend = BackendVXLAN
	}
	if !o.Network.IsValid() {
		o.Network = netip.MustParsePrefix("10.244.0.0/16")
	}
	if !o.Underlay.IsValid() {
		o.Underlay = netip.MustParsePrefix("192.168.77.0/24")
	}
	if o.MTU == 0 {
		o.MTU = 1500
	}
	if o.EtcdPrefix == "" {
		o.EtcdPrefix = "/coreos.com/network"
	}
	if o.Timeout == 0 {
		o.Timeout = 90 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	return o, o.validate()
}

func (o Options) validate() error {
	switch o.Backend {
	case BackendVXLAN, BackendUVXLAN, BackendMixed:
	default:
		return fmt.Errorf("backend %q: must be vxlan, uvxlan or mixed", o.Backend)
	}
	hosts := 1<<(o.Underlay.Addr().BitLen()-o.Underlay.Bits()) - 3
	switch {
	case o.Nodes < 1 || o.Nodes > min(hosts, 250):
		return fmt.Errorf("nodes %d: must be 1..%d", o.Nodes, min(hosts, 250))
	case o.PodsPerNode < 0 || o.PodsPerNode > 50:
		return fmt.Errorf("pods per node %d: must be 0..50", o.PodsPerNode)
	case !o.Underlay.Addr().Is4():
		return fmt.Errorf("underlay %s: must be IPv4", o.Underlay)
	case len(filepath.Join(o.StateDir, "etcd.sock")) > 100:
		return fmt.Errorf("state dir %s: too long for a unix socket path (at most ~90 bytes)", o.StateDir)
	}
	return nil
}

// NodeBackend returns the backend of node i (1-based).
func (o Options) NodeBackend(i int) string {
	if o.Backend != BackendMixed {
		return o.Backend
	}
	if i%2 == 1 {
		return BackendVXLAN
	}
	return BackendUVXLAN
}

// FindBinaries fills Weftd and CNIBin when empty. weftd and the weft plugin
// are looked up first next to self (the running weftctl executable, so that
// `go build -o bin/ ./cmd/...` just works), then in PATH. Nothing is built:
// a missing binary is an error that says how to get it.
func (o *Options) FindBinaries(self string) error {
	find := func(name string) (string, error) {
		if self != "" {
			p := filepath.Join(filepath.Dir(self), name)
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
				return p, nil
			}
		}
		p, err := exec.LookPath(name)
		if err != nil {
			return "", fmt.Errorf("find %s: not next to %s and not in PATH: build it with `go build -o %s ./cmd/%s` (or pass --%s)",
				name, self, filepath.Dir(self), name, map[string]string{"weftd": "weftd", "weft": "cni-bin"}[name])
		}
		return filepath.Abs(p)
	}
	var errs []error
	if o.Weftd == "" {
		p, err := find("weftd")
		o.Weftd = p
		errs = append(errs, err)
	}
	if o.CNIBin == "" {
		p, err := find("weft")
		o.CNIBin = filepath.Dir(p)
		errs = append(errs, err)
	} else if _, err := os.Stat(filepath.Join(o.CNIBin, "weft")); err != nil {
		errs = append(errs, fmt.Errorf("--cni-bin %s: no weft plugin there: %w", o.CNIBin, err))
	}
	return errors.Join(errs...)
}
