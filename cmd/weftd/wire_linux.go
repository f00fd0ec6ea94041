package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/backend/masq"
	"github.com/weft-net/weft/backend/uvxlan"
	"github.com/weft-net/weft/backend/vxlan"
	"github.com/weft-net/weft/internal/daemon"
	"github.com/weft-net/weft/subnet"
)

// underlayInfo is what weftd needs to know of the underlay device.
type underlayInfo struct {
	index      int
	name       string
	mtu        int
	ipv4, ipv6 netip.Addr
}

func findUnderlay(iface, regex string) (underlayInfo, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return underlayInfo{}, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	u, err := backend.FindUnderlay(h, backend.UnderlayQuery{Iface: iface, Regex: regex})
	if err != nil {
		return underlayInfo{}, err
	}
	return underlayInfo{index: u.Index, name: u.Name, mtu: u.MTU, ipv4: u.IPv4, ipv6: u.IPv6}, nil
}

// factories wires the dataplanes and the masquerade rules into the daemon.
func factories(c *config, u underlayInfo, live *liveBackend, log *slog.Logger) daemon.Factories {
	f := daemon.Factories{
		Dataplane: func(typ string, cfg *subnet.Config, lease subnet.Lease, mtu int) (daemon.Dataplane, error) {
			if lease.IPv6Subnet.IsValid() {
				if err := enableForwarding(forwardIPv6, log); err != nil {
					return daemon.Dataplane{}, err
				}
			}
			dp, err := newDataplane(typ, cfg, lease, mtu, u, log)
			if err == nil {
				live.set(dp.Backend)
			}
			return dp, err
		},
	}
	if c.ipMasq {
		f.Masquerade = func(cfg *subnet.Config) (daemon.Runner, error) {
			return masq.New(masq.Config{Network: cfg.Network, IPv6Network: cfg.IPv6Network}, log)
		}
	} else if err := masq.Remove(""); err != nil {
		log.Warn("cannot remove masquerade rules left from an earlier run", "err", err)
	}
	return f
}

// uvxlanV6Name names the TAP of a dual-stack node's IPv6 uvxlan half.
func uvxlanV6Name(vni int) string { return fmt.Sprintf("weft-u6.%d", vni) }

// newUVXLAN builds the userspace dataplane: one backend per address family
// (a TAP each), joined when the node is dual-stack.
func newUVXLAN(h *netlink.Handle, vc vxlan.Config, lease subnet.Lease, mtu int, log *slog.Logger) (backend.Backend, error) {
	var parts []backend.Backend
	if lease.Subnet.IsValid() {
		b, err := uvxlan.New(uvxlan.Config{Handle: h, VNI: vc.VNI, Port: vc.Port, MTU: mtu,
			Local: vc.Local, MAC: vc.MAC, Subnet: lease.Subnet}, log)
		if err != nil {
			return nil, err
		}
		parts = append(parts, b)
	}
	if lease.IPv6Subnet.IsValid() {
		cfg := uvxlan.Config{Handle: h, VNI: vc.VNI, Port: vc.Port, MTU: mtu,
			Local: vc.LocalIPv6, MAC: vc.MACv6, IPv6Subnet: lease.IPv6Subnet}
		if lease.Subnet.IsValid() {
			cfg.Name = uvxlanV6Name(vc.VNI)
			cfg.MTU = mtu - (backend.OverheadIPv6 - backend.OverheadIPv4)
		}
		b, err := uvxlan.New(cfg, log)
		if err != nil {
			return nil, err
		}
		parts = append(parts, b)
	}
	if len(parts) == 1 {
		return parts[0], nil
	}
	return backend.Join(parts...), nil
}

// removeUVXLAN removes the userspace dataplane's TAPs.
func removeUVXLAN(h *netlink.Handle, vni int) error {
	return errors.Join(uvxlan.RemoveDevice(h, vni), uvxlan.RemoveDeviceNamed(h, uvxlanV6Name(vni)))
}

// registerBackendMetrics exports the live dataplane's counters.
func registerBackendMetrics(reg prometheus.Registerer, live *liveBackend) {
	repairs := func(pick func(vxlan.Repairs) uint64) func() float64 {
		return func() float64 {
			if b, ok := live.get().(*vxlan.Backend); ok {
				return float64(pick(b.Repairs()))
			}
			return 0
		}
	}
	for kind, pick := range map[string]func(vxlan.Repairs) uint64{
		"device": func(r vxlan.Repairs) uint64 { return r.Device },
		"neigh":  func(r vxlan.Repairs) uint64 { return r.Neigh },
		"fdb":    func(r vxlan.Repairs) uint64 { return r.FDB },
		"route":  func(r vxlan.Repairs) uint64 { return r.Route },
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "weft_repairs_total", Help: "Kernel entries rewritten because they drifted from the programmed table, by kind.",
			ConstLabels: prometheus.Labels{"kind": kind},
		}, repairs(pick)))
	}
	reg.MustRegister(uvxlanCollector{live})
}

// uvxlanCollector exports the userspace dataplane's counters while it runs.
type uvxlanCollector struct{ live *liveBackend }

var (
	uvxlanFrames = prometheus.NewDesc("weft_uvxlan_frames_total",
		"Inner frames the userspace dataplane encapsulated (tx) or decapsulated (rx).", []string{"direction"}, nil)
	uvxlanDrops = prometheus.NewDesc("weft_uvxlan_drops_total",
		"Packets and frames the userspace dataplane dropped, by reason.", []string{"reason"}, nil)
)

func (uvxlanCollector) Describe(ch chan<- *prometheus.Desc) { ch <- uvxlanFrames; ch <- uvxlanDrops }

func (c uvxlanCollector) Collect(ch chan<- prometheus.Metric) {
	var parts []*uvxlan.Backend
	switch b := c.live.get().(type) {
	case *uvxlan.Backend:
		parts = append(parts, b)
	case *backend.Joined:
		for _, p := range b.Parts {
			if u, ok := p.(*uvxlan.Backend); ok {
				parts = append(parts, u)
			}
		}
	}
	if len(parts) == 0 {
		return
	}
	var tx, rx uint64
	drops := map[uvxlan.DropReason]uint64{}
	for _, b := range parts {
		st := b.Stats()
		tx, rx = tx+st.TxFrames, rx+st.RxFrames
		for r, n := range st.Drops {
			drops[r] += n
		}
	}
	ch <- prometheus.MustNewConstMetric(uvxlanFrames, prometheus.CounterValue, float64(tx), "tx")
	ch <- prometheus.MustNewConstMetric(uvxlanFrames, prometheus.CounterValue, float64(rx), "rx")
	for r := uvxlan.DropNone + 1; r.String() != "unknown"; r++ {
		ch <- prometheus.MustNewConstMetric(uvxlanDrops, prometheus.CounterValue, float64(drops[r]), r.String())
	}
}

func newDataplane(typ string, cfg *subnet.Config, lease subnet.Lease, mtu int, u underlayInfo, log *slog.Logger) (daemon.Dataplane, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return daemon.Dataplane{}, fmt.Errorf("netlink: %w", err)
	}
	vc := vxlan.Config{
		Handle:        h,
		VNI:           cfg.Backend.VNI,
		Port:          cfg.Backend.Port,
		UnderlayIndex: u.index,
		MTU:           mtu,
		DirectRouting: cfg.Backend.DirectRouting,
		GBP:           cfg.Backend.GBP,
		Learning:      cfg.Backend.Learning,
	}
	// The device MACs are the ones the lease advertises; the local
	// addresses stay the underlay's even when the advertised public address
	// is overwritten (a node behind NAT).
	if lease.Subnet.IsValid() && lease.Attrs.BackendData != nil {
		vc.Local, vc.Subnet, vc.MAC = u.ipv4, lease.Subnet, lease.Attrs.BackendData.VtepMAC
	}
	if lease.IPv6Subnet.IsValid() && lease.Attrs.BackendV6Data != nil {
		vc.LocalIPv6, vc.IPv6Subnet, vc.MACv6 = u.ipv6, lease.IPv6Subnet, lease.Attrs.BackendV6Data.VtepMAC
	}
	switch typ {
	case subnet.BackendTypeVXLAN:
		b, err := vxlan.New(vc, log)
		if err != nil {
			return daemon.Dataplane{}, err
		}
		return daemon.Dataplane{Backend: b, Cleanup: func() error { return removeUVXLAN(h, vc.VNI) }}, nil
	case subnet.BackendTypeUVXLAN:
		b, err := newUVXLAN(h, vc, lease, mtu, log)
		if err != nil {
			return daemon.Dataplane{}, err
		}
		return daemon.Dataplane{Backend: b, Cleanup: func() error { return vxlan.RemoveDevices(h, vc.VNI) }}, nil
	}
	return daemon.Dataplane{}, fmt.Errorf("backend %q: unsupported", typ)
}
