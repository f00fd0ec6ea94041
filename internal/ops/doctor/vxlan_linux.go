package doctor

import (
	"fmt"
	"net"

	"github.com/safchain/ethtool"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/subnet"
)

// checkVXLANPort looks for other VXLAN devices that hold weft's UDP port
// or use its VNI (a flanneld left running, a device left from another run).
func checkVXLANPort(s *state) {
	if s.k != nil && s.k.Device.Kind == inspect.KindWireGuard {
		return
	}
	port, vni := subnet.DefaultVXLANPort, subnet.DefaultVNI
	if s.Config != nil {
		port, vni = s.Config.Backend.Port, s.Config.Backend.VNI
	}
	own := ""
	if s.k != nil {
		own = s.k.Device.Name
	}
	links, err := s.Handle.LinkList()
	if err != nil {
		s.r.add("vxlan/port", Warn, "", "list links: %v", err)
		return
	}
	found := false
	for _, l := range links {
		v, ok := l.(*netlink.Vxlan)
		if !ok || v.Name == own {
			continue
		}
		switch {
		case v.Port == port:
			found = true
			st, holds, why := Fail, "holds", "the userspace VTEP cannot receive on it"
			switch {
			case v.Flags&net.FlagUp == 0:
				st, holds, why = Warn, "is down but set to", "it cannot open the port while weftd holds it, but it takes the port when it comes up first (after a reboot)"
			case s.k != nil && s.k.Device.Kind == inspect.KindVXLAN:
				st, why = Warn, "the kernel shares the port between VNIs, but a second overlay on it is a leftover (flanneld still running?)"
			}
			s.r.add("vxlan/port", st, fmt.Sprintf("stop the daemon that owns it (flanneld?), then ip link delete %s", v.Name),
				"%s (VNI %d) %s UDP port %d: %s", v.Name, v.VxlanId, holds, port, why)
		case v.VxlanId == vni:
			found = true
			s.r.add("vxlan/port", Warn, "ip link delete "+v.Name+" if nothing uses it",
				"%s uses VNI %d too (on port %d): a duplicate VNI on the node", v.Name, vni, v.Port)
		}
	}
	if !found {
		s.r.ok("vxlan/port", "no other VXLAN device on UDP port %d or VNI %d", port, vni)
	}
}

// checkOffload reports the transmit checksum offload of a kernel VXLAN
// device: before Linux 5.7, with masquerade --random-fully (which weft
// uses) or kube-proxy's NAT, the kernel sends VXLAN datagrams with a bad
// UDP checksum ("UDP: bad checksum" on the receiver) while it is on.
// weftd's vxlan backend turns it off itself on those kernels, so finding it
// on there means the device is not (or not yet) weftd's.
func checkOffload(s *state) {
	if s.k == nil || s.k.Device.Kind == inspect.KindWireGuard {
		return
	}
	if s.k.Device.Kind != inspect.KindVXLAN {
		s.r.ok("offload/checksum", "%s is a TAP: weftd builds the VXLAN datagrams itself, so the kernel VXLAN checksum offload bug does not apply", s.k.Device.Name)
		return
	}
	var feats map[string]bool
	err := s.Do.Run(func() error {
		e, err := ethtool.NewEthtool()
		if err != nil {
			return err
		}
		defer e.Close()
		feats, err = e.Features(s.k.Device.Name)
		return err
	})
	if err != nil {
		s.r.add("offload/checksum", Warn, "", "read the offload features of %s: %v", s.k.Device.Name, err)
		return
	}
	on := feats["tx-checksum-ip-generic"]
	major, minor := kernelVersion()
	fix := "ethtool -K " + s.k.Device.Name + " tx-checksum-ip-generic off"
	switch {
	case on && (major < 5 || major == 5 && minor < 7):
		s.r.add("offload/checksum", Fail, "run weftd (on kernels before 5.7 it turns the offload off when it creates or adopts the device and at every full sync); meanwhile: "+fix,
			"kernel %d.%d < 5.7 with tx-checksum-ip-generic on: NATed VXLAN traffic (Services, masquerade) leaves with a bad checksum; weftd turns it off on such kernels, so %s is not managed by a running weftd of this release", major, minor, s.k.Device.Name)
	case on:
		s.r.ok("offload/checksum", "tx-checksum-ip-generic on; kernel %d.%d ≥ 5.7 carries the fix, so weftd leaves it on (if a peer logs \"UDP: bad checksum\" from this node, run: %s)", major, minor, fix)
	default:
		s.r.ok("offload/checksum", "tx-checksum-ip-generic off on %s", s.k.Device.Name)
	}
}

func kernelVersion() (major, minor int) {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return 0, 0
	}
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor)
	return major, minor
}
