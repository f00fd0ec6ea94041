package doctor

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/masq"
	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// checkKernel checks the kernel features and settings weft relies on.
func checkKernel(s *state) {
	checkVXLANModule(s)
	checkNFTables(s)
	switch v, err := s.sysctl("net/ipv4/ip_forward"); {
	case err != nil:
		s.r.add("kernel/ip_forward", Fail, "", "read net.ipv4.ip_forward: %v", err)
	case v != "1":
		s.r.add("kernel/ip_forward", Fail, "sysctl -w net.ipv4.ip_forward=1 (and net.ipv4.ip_forward=1 in /etc/sysctl.d/ to keep it)",
			"net.ipv4.ip_forward = %s: the node drops every packet between pods and the overlay", v)
	default:
		s.r.ok("kernel/ip_forward", "net.ipv4.ip_forward = 1")
	}
	checkRPFilter(s)
	checkBrNetfilter(s)
}

// fixVXLANModule says how to give a kernel its vxlan driver.
const fixVXLANModule = "install the kernel's vxlan module (Ubuntu and Raspberry Pi OS: apt install linux-modules-extra-$(uname -r); then modprobe vxlan) and restart weftd"

func checkVXLANModule(s *state) {
	configured := s.Config != nil && s.Config.Backend.Type == subnet.BackendTypeVXLAN
	switch {
	case s.fallback != "":
		s.r.add("kernel/vxlan", Warn, fixVXLANModule+": it then runs kernel VXLAN, as configured",
			"weftd runs uvxlan in place of vxlan: the kernel refused a VXLAN device for want of the driver (weft_backend_fallback{%s}); the wire and lease are the same", s.fallback)
	case s.k != nil && s.k.Device.Kind == inspect.KindTAP && configured && s.HealthAddr == "" && !moduleLoaded("vxlan"):
		s.r.add("kernel/vxlan", Warn, fixVXLANModule+", unless weftd runs uvxlan by --backend uvxlan",
			"%s is a TAP while the network config asks for vxlan, and no /sys/module/vxlan: weftd may run uvxlan because the kernel has no VXLAN driver (pass --health-addr to read weftd's reason)", s.k.Device.Name)
	case s.k != nil && s.k.Device.Kind == inspect.KindWireGuard:
		s.r.ok("kernel/vxlan", "%s is a WireGuard device: no VXLAN driver needed", s.k.Device.Name)
	case s.k != nil && s.k.Device.Kind == inspect.KindVXLAN:
		s.r.ok("kernel/vxlan", "%s is a kernel VXLAN device: the vxlan driver works", s.k.Device.Name)
	case s.k != nil:
		s.r.ok("kernel/vxlan", "%s is a TAP: uvxlan encapsulates in weftd and needs no vxlan module", s.k.Device.Name)
	case moduleLoaded("vxlan"):
		s.r.ok("kernel/vxlan", "vxlan module loaded (/sys/module/vxlan)")
	default:
		s.r.add("kernel/vxlan", Warn, fixVXLANModule+"; without it, weftd runs uvxlan in place of vxlan",
			"no overlay device and no /sys/module/vxlan: the vxlan driver may be missing (it may also be built in)")
	}
}

func moduleLoaded(name string) bool {
	_, err := os.Stat("/sys/module/" + name)
	return err == nil
}

// checkNFTables lists the node's nftables tables, proving nf_tables works,
// and looks for weft's masquerade table when weftd masquerades.
func checkNFTables(s *state) {
	var tables []*nftables.Table
	err := s.Do.Run(func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		tables, err = c.ListTables()
		return err
	})
	if err != nil {
		s.r.add("kernel/nf_tables", Fail, "modprobe nf_tables (weftd's masquerade rules need it), or run weftd with --ip-masq=false", "list nftables tables: %v", err)
		return
	}
	want := s.file != nil && s.file.IPMasq
	has := false
	for _, t := range tables {
		has = has || t.Name == masq.TableIPv4 && t.Family == nftables.TableFamilyIPv4
	}
	switch {
	case want && !has:
		s.r.add("kernel/nf_tables", Fail, "see weftd's log for masquerade errors; weftd rewrites the table within seconds when it runs",
			"FLANNEL_IPMASQ=true but table ip %s is missing: pods cannot reach outside the cluster", masq.TableIPv4)
	case want:
		s.r.ok("kernel/nf_tables", "nf_tables works: %d tables, weft's masquerade table ip %s present", len(tables), masq.TableIPv4)
	default:
		s.r.ok("kernel/nf_tables", "nf_tables works: %d tables (weftd does not masquerade here)", len(tables))
	}
}

// rpFilter is the effective reverse-path filter of a device: the larger
// of conf/all and conf/<dev> (0 off, 1 strict, 2 loose).
func (s *state) rpFilter(dev string) (int, error) {
	all, err := s.sysctl("net/ipv4/conf/all/rp_filter")
	if err != nil {
		return 0, err
	}
	one, err := s.sysctl("net/ipv4/conf/" + dev + "/rp_filter")
	if err != nil {
		return 0, err
	}
	a, _ := strconv.Atoi(all)
	d, _ := strconv.Atoi(one)
	return max(a, d), nil
}

func checkRPFilter(s *state) {
	var devs, strict []string
	if s.k != nil {
		devs = append(devs, s.k.Device.Name)
	}
	if u, _, err := s.underlay(); err == nil {
		devs = append(devs, u.Attrs().Name)
	}
	var ev []string
	for _, d := range devs {
		v, err := s.rpFilter(d)
		if err != nil {
			ev = append(ev, fmt.Sprintf("%s: %v", d, err))
			continue
		}
		ev = append(ev, fmt.Sprintf("%s %d", d, v))
		if v == 1 {
			strict = append(strict, d)
		}
	}
	if len(strict) > 0 {
		cmd := "sysctl -w net.ipv4.conf.all.rp_filter=2"
		for _, d := range strict {
			cmd += " net.ipv4.conf." + d + ".rp_filter=2"
		}
		s.r.add("kernel/rp_filter", Warn, cmd+" (loose)",
			"strict reverse-path filter on %s (%s): packets that arrive on another device than the route back (multi-homed nodes, asymmetric underlays) are dropped", strings.Join(strict, ", "), strings.Join(ev, ", "))
		return
	}
	s.r.ok("kernel/rp_filter", "effective rp_filter (0 off, 2 loose): %s", strings.Join(ev, ", "))
}

// checkBrNetfilter reports br_netfilter where it matters: kube-proxy needs
// bridged pod traffic to pass iptables; without Kubernetes it is optional.
func checkBrNetfilter(s *state) {
	v, err := s.sysctl("net/bridge/bridge-nf-call-iptables")
	switch {
	case s.Kube != nil && err != nil:
		s.r.add("kernel/br_netfilter", Warn, "modprobe br_netfilter; sysctl -w net.bridge.bridge-nf-call-iptables=1",
			"br_netfilter is not loaded: kube-proxy's service rules miss traffic between pods on the same bridge")
	case s.Kube != nil && v != "1":
		s.r.add("kernel/br_netfilter", Warn, "sysctl -w net.bridge.bridge-nf-call-iptables=1",
			"net.bridge.bridge-nf-call-iptables = %s: kube-proxy's service rules miss traffic between pods on the same bridge", v)
	case s.Kube != nil:
		s.r.ok("kernel/br_netfilter", "net.bridge.bridge-nf-call-iptables = 1, as kube-proxy needs")
	case err != nil:
		s.r.ok("kernel/br_netfilter", "br_netfilter not loaded; not needed without kube-proxy")
	default:
		s.r.ok("kernel/br_netfilter", "net.bridge.bridge-nf-call-iptables = %s; bridged pod traffic passes the forward hooks, where weft's table accepts it", v)
	}
}

// underlay finds the underlay link: the VXLAN device's, else the link that
// holds this node's public IP.
func (s *state) underlay() (netlink.Link, netip.Addr, error) {
	if s.k != nil && s.k.Device.Underlay != "" {
		l, err := s.Handle.LinkByName(s.k.Device.Underlay)
		return l, s.k.Device.Local, err
	}
	if s.self == nil {
		return nil, netip.Addr{}, fmt.Errorf("no lease for this node, so no public IP to find the underlay by")
	}
	ip := s.self.Attrs.PublicIP
	addrs, err := s.Handle.AddrList(nil, unix.AF_INET)
	if err != nil {
		return nil, ip, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if b, _ := netip.AddrFromSlice(a.IP); b.Unmap() == ip {
			l, err := s.Handle.LinkByIndex(a.LinkIndex)
			return l, ip, err
		}
	}
	return nil, ip, fmt.Errorf("no link holds this node's public IP %s (its lease): weftd advertises an address the node does not have", ip)
}

// checkUnderlay checks the underlay's MTU against the overlay's, and that
// every peer's public IP is reached through it.
func checkUnderlay(s *state) {
	u, local, err := s.underlay()
	if err != nil {
		s.r.add("underlay/device", Fail, "start weftd with --iface <the underlay device> or --public-ip <an address of it>", "%v", err)
		return
	}
	name, mtu := u.Attrs().Name, u.Attrs().MTU
	s.r.ok("underlay/device", "%s (MTU %d), public IP %s", name, mtu, local)
	if s.k != nil {
		overhead, what := vtep.OverheadIPv4, "VXLAN"
		if local.Is6() {
			overhead = vtep.OverheadIPv6
		}
		if s.k.Device.Kind == inspect.KindWireGuard { // outer IP, UDP, WireGuard's header and tag
			overhead, what = map[bool]int{false: 60, true: 80}[local.Is6()], "WireGuard"
		}
		fileMTU := "no subnet file"
		if s.file != nil {
			fileMTU = fmt.Sprintf("FLANNEL_MTU %d", s.file.MTU)
		}
		if need := s.k.Device.MTU + overhead; need > mtu {
			s.r.add("underlay/mtu", Fail, fmt.Sprintf("raise %s's MTU to %d, or restart weftd so that it sizes %s to %d (and recreate the pods)", name, need, s.k.Device.Name, mtu-overhead),
				"%s MTU %d + %d bytes of %s = %d > %s MTU %d (%s): full-size packets are dropped or fragmented", s.k.Device.Name, s.k.Device.MTU, overhead, what, need, name, mtu, fileMTU)
		} else {
			s.r.ok("underlay/mtu", "%s MTU %d + %d ≤ %s MTU %d; %s", s.k.Device.Name, s.k.Device.MTU, overhead, name, mtu, fileMTU)
		}
	}
	var wrong []string
	for _, p := range s.peers() {
		rs, err := s.Handle.RouteGet(p.Attrs.PublicIP.AsSlice())
		if err != nil || len(rs) == 0 {
			wrong = append(wrong, fmt.Sprintf("%s: no route (%v)", p.Attrs.PublicIP, err))
			continue
		}
		if rs[0].LinkIndex != u.Attrs().Index {
			l, _ := s.Handle.LinkByIndex(rs[0].LinkIndex)
			via := "link " + strconv.Itoa(rs[0].LinkIndex)
			if l != nil {
				via = l.Attrs().Name
			}
			wrong = append(wrong, fmt.Sprintf("%s leaves by %s", p.Attrs.PublicIP, via))
		}
	}
	if len(wrong) > 0 {
		s.r.add("underlay/route", Warn, "pick the device that reaches the other nodes with weftd's --iface (or --iface-regex)",
			"routes to peers do not leave through %s: %s", name, strings.Join(wrong, "; "))
		return
	}
	s.r.ok("underlay/route", "the routes to all %d peers leave through %s", len(s.peers()), name)
}
