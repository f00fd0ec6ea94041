package daemon

import (
	"fmt"
	"log/slog"

	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/backend/wireguard"
	"github.com/weft-net/weft/subnet"
)

// wireGuardLeaseData adds the node's public key and ports to a wireguard
// lease, reading (or creating) the private key in $WIREGUARD_KEY_FILE.
func wireGuardLeaseData(typ string, cfg *subnet.Config, a *subnet.LeaseAttrs) error {
	if typ != subnet.BackendTypeWireGuard {
		return nil
	}
	key, _, err := wireguard.LoadOrCreateKey(wireguard.KeyFile())
	if err != nil {
		return err
	}
	v4, v6 := wireguard.LeaseData(key.PublicKey(), cfg.Backend)
	if cfg.EnableIPv4 {
		a.WireGuard = &v4
	}
	if cfg.EnableIPv6 {
		a.WireGuardV6 = &v6
	}
	return nil
}

// newWireGuard builds the wireguard dataplane for the lease.
func newWireGuard(h *netlink.Handle, cfg *subnet.Config, lease subnet.Lease, mtu int, u underlayInfo, netns string, log *slog.Logger) (Dataplane, error) {
	path := wireguard.KeyFile()
	key, created, err := wireguard.LoadOrCreateKey(path)
	if err != nil {
		return Dataplane{}, err
	}
	if created {
		return Dataplane{}, fmt.Errorf("wireguard key file %s appeared only now: the lease advertises another key", path)
	}
	wc := wireguard.Config{Handle: h, PrivateKey: key, MTU: mtu,
		Subnet: lease.Subnet, IPv6Subnet: lease.IPv6Subnet, Network: cfg.Network, IPv6Network: cfg.IPv6Network,
		Local: lease.Attrs.PublicIP, LocalIPv6: lease.Attrs.PublicIPv6}
	if err := wc.FromBackend(cfg.Backend); err != nil {
		return Dataplane{}, err
	}
	log.Info("wireguard key", "file", path, "publicKey", key.PublicKey().String())
	b, err := wireguard.New(wc, log)
	if err != nil {
		return Dataplane{}, err
	}
	return Dataplane{Backend: b, Cleanup: func() error { return removeOthers(h, cfg, subnet.BackendTypeWireGuard, netns, log) }}, nil
}
