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
	b, ok := c.live.get().(*uvxlan.Backend)
	if !ok {
		return
	}
	st := b.Stats()
	ch <- prometheus.MustNewConstMetric(uvxlanFrames, prometheus.CounterValue, float64(st.TxFrames), "tx")
	ch <- prometheus.MustNewConstMetric(uvxlanFrames, prometheus.CounterValue, float64(st.RxFrames), "rx")
	for r := uvxlan.DropNone + 1; r.String() != "unknown"; r++ {
		ch <- prometheus.MustNewConstMetric(uvxlanDrops, prometheus.CounterValue, float64(st.Drops[r]), r.String())
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
		return daemon.Dataplane{Backend: b, Cleanup: func() error { return uvxlan.RemoveDevice(h, vc.VNI) }}, nil
	case subnet.BackendTypeUVXLAN:
		// One uvxlan backend carries one address family.
		if lease.Subnet.IsValid() && lease.IPv6Subnet.IsValid() {
			return daemon.Dataplane{}, errors.New("uvxlan does not carry dual-stack yet: use the vxlan backend for dual-stack nodes")
		}
		uc := uvxlan.Config{Handle: h, VNI: vc.VNI, Port: vc.Port, MTU: mtu,
			Local: vc.Local, MAC: vc.MAC, Subnet: lease.Subnet}
		if lease.IPv6Subnet.IsValid() {
			uc.Local, uc.MAC, uc.IPv6Subnet = vc.LocalIPv6, vc.MACv6, lease.IPv6Subnet
		}
		b, err := uvxlan.New(uc, log)
		if err != nil {
			return daemon.Dataplane{}, err
		}
		return daemon.Dataplane{Backend: b, Cleanup: func() error { return vxlan.RemoveDevices(h, vc.VNI) }}, nil
	}
	return daemon.Dataplane{}, fmt.Errorf("backend %q: unsupported", typ)
}
