package tunpath

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync/atomic"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun"
)

// Peer is another node: its pod subnet, underlay address and VTEP MAC.
type Peer struct {
	Subnet netip.Prefix
	Addr   netip.Addr
	MAC    subnet.MAC
}

// Config is a node's configuration.
type Config struct {
	NetNS  string       // path of the host's network namespace ("": this one)
	Name   string       // TUN device name (default "weft-t.<VNI>")
	Local  netip.Addr   // underlay address; the VTEP MAC is vtep.DeviceMAC(Local, VNI)
	Subnet netip.Prefix // this node's pod subnet: <Subnet>.0 goes on the TUN
	MTU    int          // overlay MTU of the TUN (default 1450)
	VNI    int          // default 1
	Port   uint16       // VXLAN UDP port (default 8472)
	Peers  []Peer
}

// EventPartialChecksum counts, in Stats().Events, the partial TCP and UDP
// checksums of kernel VXLAN senders that the node completed.
const EventPartialChecksum = "partial_checksum"

// Node is one host's TUN-based VXLAN dataplane.
type Node struct {
	cfg   Config
	mac   subnet.MAC
	peers []peer
	log   *slog.Logger
	ready chan struct{}
	tx    atomic.Uint64
	rx    atomic.Uint64
	// partial counts the partial checksums completed (EventPartialChecksum).
	partial atomic.Uint64
	drops   map[string]*atomic.Uint64 // fixed at New: read concurrently
}

// New checks cfg and returns a node that Run starts.
func New(cfg Config, log *slog.Logger) (*Node, error) {
	if cfg.VNI == 0 {
		cfg.VNI = 1
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1450
	}
	if cfg.Port == 0 {
		cfg.Port = 8472
	}
	if cfg.Name == "" {
		cfg.Name = fmt.Sprintf("weft-t.%d", cfg.VNI)
	}
	switch {
	case cfg.VNI < 0 || cfg.VNI >= 1<<24:
		return nil, fmt.Errorf("tunpath: VNI %d out of range (1 to 2^24-1)", cfg.VNI)
	case !cfg.Local.IsValid():
		return nil, errors.New("tunpath: no local underlay address")
	case !cfg.Subnet.IsValid():
		return nil, errors.New("tunpath: no subnet")
	case cfg.MTU < 1280 || cfg.MTU > 65535-headroom:
		return nil, fmt.Errorf("tunpath: MTU %d out of range (1280 to %d)", cfg.MTU, 65535-headroom)
	case len(cfg.Name) >= 16:
		return nil, fmt.Errorf("tunpath: device name %q longer than 15 bytes", cfg.Name)
	}
	n := &Node{cfg: cfg, mac: vtep.DeviceMAC(cfg.Local, cfg.VNI), log: log.With("component", "tunpath"),
		ready: make(chan struct{}), drops: map[string]*atomic.Uint64{}}
	for _, p := range cfg.Peers {
		if !p.Subnet.IsValid() || !p.Addr.IsValid() || p.MAC == (subnet.MAC{}) {
			return nil, fmt.Errorf("tunpath: peer %v: needs a subnet, an underlay address and a MAC", p)
		}
		n.peers = append(n.peers, peer{subnet: p.Subnet.Masked(), addr: p.Addr.Unmap(), mac: p.MAC})
	}
	for _, r := range []string{DropNoPeer, DropNotIP, DropSend, DropUnknownSource, DropShort, DropTooLong, DropFlags,
		DropVNI, DropDestMAC, DropEtherType, DropIPHeader, DropForeignSource, DropTUNWrite, DropTUNRead} {
		n.drops[r] = new(atomic.Uint64)
	}
	return n, nil
}

// Ready is closed once the device, its routes and the sockets are up.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// Stats returns the frames sent and received and the drops by reason.
func (n *Node) Stats() backend.Stats {
	s := backend.Stats{TxFrames: n.tx.Load(), RxFrames: n.rx.Load(), Drops: map[string]uint64{},
		Events: map[string]uint64{EventPartialChecksum: n.partial.Load()}}
	for r, c := range n.drops {
		if v := c.Load(); v > 0 {
			s.Drops[r] = v
		}
	}
	return s
}

// Run creates the TUN and its routes, opens the sockets and forwards until
// ctx ends; it then closes them and deletes the TUN.
func (n *Node) Run(ctx context.Context) error {
	var (
		dev  tun.Device
		bind conn.Bind
		fns  []conn.ReceiveFunc
		snd  *gsoSender
	)
	err := inNS(n.cfg.NetNS, func() (err error) {
		// Everything that binds to the namespace happens on this thread:
		// the TUN, wireguard-go's netlink socket and MTU ioctl, the UDP
		// sockets.
		if dev, err = tun.CreateTUN(n.cfg.Name, n.cfg.MTU); err != nil {
			return fmt.Errorf("create TUN %s: %w", n.cfg.Name, err)
		}
		if snd, err = newGSOSender(n.cfg.Local); err != nil {
			dev.Close()
			return err
		}
		bind = conn.NewStdNetBind()
		if fns, _, err = bind.Open(n.cfg.Port); err != nil {
			dev.Close()
			snd.close()
			return fmt.Errorf("open UDP port %d: %w", n.cfg.Port, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer dev.Close()
	defer bind.Close()
	defer snd.close()
	go func() { // wireguard-go's listeners block until their events are taken
		for range dev.Events() {
		}
	}()
	if err := n.configure(); err != nil {
		return err
	}
	to := make([]unix.Sockaddr, len(n.peers))
	for i, p := range n.peers {
		to[i] = sockaddr(netip.AddrPortFrom(p.addr, n.cfg.Port))
	}
	n.log.Info("ready", "device", n.cfg.Name, "local", n.cfg.Local, "peers", len(n.peers), "batch", dev.BatchSize())
	close(n.ready)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		<-gctx.Done()
		return errors.Join(bind.Close(), dev.Close(), snd.close())
	})
	g.Go(func() error { return n.egress(dev, snd, to) })
	for _, f := range fns {
		g.Go(func() error { return n.ingress(dev, f, bind.BatchSize()) })
	}
	err = g.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// configure sets the TUN up with <Subnet>.0 and routes the peers'
// subnets through it.
func (n *Node) configure() error {
	h, err := handleIn(n.cfg.NetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(n.cfg.Name)
	if err != nil {
		return fmt.Errorf("find %s: %w", n.cfg.Name, err)
	}
	// No IPv6 link-local address: its solicitations would reach no peer.
	if err := h.LinkSetIP6AddrGenMode(l, nl.IN6_ADDR_GEN_MODE_NONE); err != nil {
		return fmt.Errorf("%s: IPv6 address generation off: %w", n.cfg.Name, err)
	}
	self := netip.PrefixFrom(n.cfg.Subnet.Masked().Addr(), n.cfg.Subnet.Addr().BitLen())
	if err := h.AddrReplace(l, &netlink.Addr{IPNet: ipNet(self)}); err != nil {
		return fmt.Errorf("%s: add %s: %w", n.cfg.Name, self, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("%s up: %w", n.cfg.Name, err)
	}
	for _, p := range n.peers {
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(p.subnet), Scope: netlink.SCOPE_LINK}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("route %s dev %s: %w", p.subnet, n.cfg.Name, err)
		}
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func inNS(path string, f func() error) error {
	if path == "" {
		return f()
	}
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return f() })
}

func handleIn(path string) (h *netlink.Handle, err error) {
	err = inNS(path, func() (err error) {
		h, err = netlink.NewHandle()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %q: %w", path, err)
	}
	return h, nil
}

// bufSize is the size of each receive buffer: room for a UDP GRO
// super-datagram, and for the TUN's GRO to merge segments into it.
const bufSize = headroom + 65535

func newBufs(n, size int) [][]byte {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	return bufs
}

// egress reads batches of IP packets from the TUN, puts the headers in
// front of each and sends each run of packets for one peer in one Send.
func (n *Node) egress(dev tun.Device, snd *gsoSender, to []unix.Sockaddr) error {
	bs := dev.BatchSize()
	// Each segment in a buffer of its own, sent from there.
	bufs, sizes := newBufs(bs, headroom+n.cfg.MTU), make([]int, bs)
	out := make([][]byte, 0, bs)
	vni := uint32(n.cfg.VNI)
	last := -1
	send := func() {
		lost, err := snd.send(out, to[last])
		n.tx.Add(uint64(len(out) - lost))
		if lost > 0 {
			n.drops[DropSend].Add(uint64(lost))
			n.log.Debug("send", "err", err)
		}
		out = out[:0]
	}
	for {
		cnt, err := dev.Read(bufs, sizes, headroom)
		switch {
		case errors.Is(err, os.ErrClosed):
			return nil
		case err != nil: // a packet that the TUN's offload code refused
			n.drops[DropTUNRead].Add(1)
			n.log.Debug("read TUN", "err", err)
		}
		for i := range cnt {
			dst, et, ok := innerDst(bufs[i][headroom : headroom+sizes[i]])
			if !ok {
				n.drops[DropNotIP].Add(1)
				continue
			}
			pi := lookup(n.peers, dst)
			if pi < 0 {
				n.drops[DropNoPeer].Add(1)
				continue
			}
			if pi != last && len(out) > 0 {
				send()
			}
			last = pi
			putHeaders(bufs[i][:headroom], vni, n.peers[pi].mac, n.mac, et)
			out = append(out, bufs[i][:headroom+sizes[i]])
		}
		if len(out) > 0 {
			send()
		}
	}
}

// ingress receives batches of datagrams, checks each and writes the inner
// IP packets of those it takes to the TUN in one batch.
func (n *Node) ingress(dev tun.Device, recv conn.ReceiveFunc, batch int) error {
	bufs, sizes, eps := newBufs(batch, bufSize), make([]int, batch), make([]conn.Endpoint, batch)
	out := make([][]byte, 0, batch)
	vni := uint32(n.cfg.VNI)
	for {
		cnt, err := recv(bufs, sizes, eps)
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		out = out[:0]
		for i := range cnt {
			if sizes[i] == 0 {
				continue
			}
			l, drop := check(bufs[i][:sizes[i]], eps[i].DstIP(), n.peers, vni, n.mac, n.cfg.MTU)
			if drop != "" {
				n.drops[drop].Add(1)
				continue
			}
			if completePartial(bufs[i][headroom : headroom+l]) {
				n.partial.Add(1)
			}
			out = append(out, bufs[i][:headroom+l])
		}
		if len(out) == 0 {
			continue
		}
		if _, err := dev.Write(out, headroom); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return nil
			}
			// The batch's other packets were written; which one
			// failed is not told apart.
			n.drops[DropTUNWrite].Add(1)
			n.log.Debug("write TUN", "err", err)
			n.rx.Add(uint64(len(out) - 1))
			continue
		}
		n.rx.Add(uint64(len(out)))
	}
}
