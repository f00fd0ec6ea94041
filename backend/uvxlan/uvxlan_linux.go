package uvxlan

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// Config configures a userspace VXLAN backend on one node.
type Config struct {
	// Handle is a netlink handle bound to the node's network namespace. When
	// nil, one is opened in NetNS (or in the current namespace).
	Handle *netlink.Handle
	// NetNS is the path of the node's network namespace (for example
	// /run/netns/node1). The TAP and the UDP sockets are opened inside it.
	// Empty means the namespace of the calling process.
	NetNS string

	// One Backend carries one address family, as in Flannel: IPv4 subnets
	// over an IPv4 underlay (Local and Subnet), or IPv6 subnets over an IPv6
	// underlay (Local and IPv6Subnet). A dual-stack node runs two, the
	// second with its own Name (for example "weft-u6.1").

	Name  string     // TAP device name; default DeviceName(VNI)
	VNI   int        // VXLAN network identifier; default 1
	Port  int        // UDP port, ours and the peers'; default 8472
	Local netip.Addr // this node's underlay address, IPv4 or IPv6
	// MAC is the VTEP MAC the node advertises in its lease; zero means
	// vtep.DeviceMAC(Local, VNI). It must be stable across restarts.
	MAC subnet.MAC
	MTU int // overlay MTU (underlay MTU − 50 on IPv4, − 70 on IPv6); default for 1500
	// PodMTU is the pods' MTU (the subnet file's FLANNEL_MTU), at most MTU,
	// its default. A TCP super-segment a peer's kernel handed over whole
	// (tunnel GSO through a veth, with no segment size) is cut into
	// segments that fit it. A dual-stack node gives its pods the IPv6
	// overlay's MTU, 20 below the IPv4 TAP's, and both halves need it.
	PodMTU int
	// Subnet is this node's IPv4 subnet when Local is IPv4: <Subnet>.0/32
	// goes on the TAP.
	Subnet netip.Prefix
	// IPv6Subnet is this node's IPv6 subnet when Local is IPv6:
	// <IPv6Subnet>::/128 goes on the TAP.
	IPv6Subnet netip.Prefix

	// Plain turns the offloads off: the TAP is opened with water (which
	// cannot set IFF_VNET_HDR), every frame costs a TAP read or write, and
	// UDP GSO/GRO are not used. It exists for comparison and as a fallback
	// for kernels without TAP offloads.
	Plain bool
	// Queues is how many TAP queues and receive sockets there are, each with
	// its own egress and ingress goroutine; default 1. With more, the TAP is
	// multi-queue (the kernel spreads flows over the queues) and the receive
	// sockets share the port with SO_REUSEPORT (the kernel spreads peers'
	// source ports over them). A persistent TAP keeps its queue mode: change
	// Queues between 1 and more only after RemoveDevice.
	Queues int
	// SourcePorts is how many UDP sockets, each on its own ephemeral port of
	// the local port range, encapsulated frames leave from; the inner flow
	// hash picks one. Default 16.
	SourcePorts int
	// Reconcile is the period of the full sync that re-reads the device,
	// its neighbours and routes and repairs them (changes the kernel
	// reports are repaired at once); default kernel.DefaultResync.
	Reconcile time.Duration
	// AllowForeignSources turns off the inner source check: by default an
	// inner IPv4/IPv6 packet whose source address is not inside the sending
	// peer's subnets is dropped (DropForeignSource). Routed setups that
	// forward other sources through a node need it off; the risk is that
	// anyone able to send UDP from a peer's underlay address can then inject
	// packets into the pod network with any source address.
	AllowForeignSources bool
	// FastPath has the kernel carry the bulk of the traffic: weft loads two
	// tc BPF programs it generates, one on the TAP's egress that
	// encapsulates IPv4 frames to known peers and sends them out of the
	// underlay device, one on that device's ingress that takes VXLAN
	// packets from known peers off, with the same checks, and hands the
	// inner frames to the TAP (and a third on the pod bridge, see
	// PodBridge). What a program does not fully check goes on
	// to the userspace path as before. IPv4 backends only; it needs
	// CAP_BPF and CAP_NET_ADMIN and Linux 6.6 or later (tcx). Where it
	// cannot be set up, the backend logs why and runs without it. See the
	// package documentation, "Fast path".
	FastPath bool
	// PodBridge is the bridge the node's pods are on (the CNI plugin's
	// bridge setting); default "cni0". With the fast path, a third program
	// on its egress sends the super-packets from the TAP that the node
	// routes to a pod straight to the pod's port, which the bridge would
	// cut into segments. Where there is no such bridge, nothing is attached.
	PodBridge string
	// Files, when set, keeps the TAP queues and receive sockets open while
	// the process restarts (a service manager's file descriptor store):
	// what arrives meanwhile waits in the kernel's queues instead of being
	// dropped, and the next run takes the files back and drains them. The
	// packet loops of a run that took files over start once the first
	// table is programmed, so the frames that waited find their peers.
	Files Files

	// haveTCX, if set, stands for the kernel's answer to whether it has
	// tcx (haveTCX): a test seam.
	haveTCX func() error
}

// DefaultPodBridge is Config.PodBridge's default, the CNI plugin's.
const DefaultPodBridge = "cni0"

// DeviceName is the default name of the TAP device for vni ("weft-u.1").
func DeviceName(vni int) string { return fmt.Sprintf("weft-u.%d", vni) }

func (c *Config) setDefaults() error {
	if c.VNI == 0 {
		c.VNI = subnet.DefaultVNI
	}
	if c.Port == 0 {
		c.Port = subnet.DefaultVXLANPort
	}
	if c.Name == "" {
		c.Name = DeviceName(c.VNI)
	}
	if c.MAC.IsZero() && c.Local.IsValid() {
		c.MAC = vtep.DeviceMAC(c.Local.Unmap(), c.VNI)
	}
	if c.MTU == 0 {
		c.MTU = vtep.OverlayMTU(1500, c.Local.Is6())
	}
	if c.PodMTU == 0 || c.PodMTU > c.MTU {
		c.PodMTU = c.MTU
	}
	if c.Queues == 0 {
		c.Queues = 1
	}
	if c.SourcePorts == 0 {
		c.SourcePorts = 16
	}
	if c.Reconcile == 0 {
		c.Reconcile = kernel.DefaultResync
	}
	if c.PodBridge == "" {
		c.PodBridge = DefaultPodBridge
	}
	switch {
	case c.VNI < 0 || c.VNI > maxVNI:
		return fmt.Errorf("vni %d out of range", c.VNI)
	case c.Port < 1 || c.Port > 65535:
		return fmt.Errorf("port %d out of range", c.Port)
	case len(c.Name) > 15:
		return fmt.Errorf("device name %q longer than 15 bytes", c.Name)
	case !c.Local.IsValid():
		return errors.New("no local underlay address")
	case c.MAC[0]&1 != 0:
		return fmt.Errorf("vtep mac %s is not a unicast address", c.MAC)
	case c.MTU < 576 || c.MTU > 65000:
		return fmt.Errorf("mtu %d out of range", c.MTU)
	case c.PodMTU < 576:
		return fmt.Errorf("pod mtu %d out of range", c.PodMTU)
	case c.Subnet.IsValid() && (!c.Subnet.Addr().Is4() || c.Local.Unmap().Is6()):
		return fmt.Errorf("subnet %s needs an IPv4 subnet and local address", c.Subnet)
	case c.IPv6Subnet.IsValid() && (!c.IPv6Subnet.Addr().Is6() || !c.Local.Unmap().Is6()):
		return fmt.Errorf("ipv6 subnet %s needs an IPv6 subnet and local address", c.IPv6Subnet)
	case c.Queues < 1 || c.Queues > 16:
		return fmt.Errorf("queues %d out of range", c.Queues)
	case c.SourcePorts < 1 || c.SourcePorts > 256:
		return fmt.Errorf("source ports %d out of range", c.SourcePorts)
	}
	c.Local = c.Local.Unmap()
	return nil
}

// Backend is the userspace VXLAN dataplane of one node. Create it with New.
type Backend struct {
	cfg Config
	log *slog.Logger
	dec decoder

	peers           atomic.Pointer[peers] // read by the packet loops
	*kernel.Desired                       // the latest table, Ready

	ctr  counters
	fast *fastPath // nil without Config.FastPath, or where it cannot work
	// noUDPGSO makes the userspace path send one datagram per UDP send, no
	// UDP GSO super-packets: with the fast path, from the start of Run until
	// a sync finds its programs cannot be attached. A peer's ingress program
	// hands a node that sends super-packets of datagrams to its userspace
	// path for good, which a fast path node's userspace path must not make
	// it do in the moments it carries traffic (before the programs attach,
	// while Run stops, for frames the programs do not take).
	noUDPGSO atomic.Bool
	running  atomic.Bool
	dp       atomic.Pointer[datapath] // the running datapath, for tests

	// adoptedWait and stopWait are the constants of those names; tests
	// lengthen them, so that a wait that ran into its limit shows.
	adoptedWait, stopWait time.Duration
}

var _ backend.Backend = (*Backend)(nil)

// New checks cfg and returns a backend that does nothing until Run.
func New(cfg Config, log *slog.Logger) (*Backend, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("uvxlan config: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Backend{
		cfg:     cfg,
		log:     log.With("component", "uvxlan", "dev", cfg.Name),
		dec:     decoder{vni: uint32(cfg.VNI), mac: cfg.MAC, maxFrame: ethHeaderLen + cfg.MTU},
		Desired: kernel.NewDesired(),

		adoptedWait: adoptedWait,
		stopWait:    stopWait,
	}
	b.peers.Store(newPeers(nil, cfg.Port, cfg.Local.Is6()))
	if cfg.FastPath {
		b.openFastPath()
	}
	return b, nil
}

// Set hands the backend a new peer table and returns at once: it never
// waits for the kernel. Without the fast path the packet loops see it at
// once (an atomic pointer swap); with it, Run's next sync writes the fast
// path's maps first and then hands the table to the packet loops, so a
// peer the userspace path knows is already the fast path's and no flow
// starts on the userspace path to be overtaken when the maps catch up.
// Neighbours and routes follow in Run. t must not be modified afterwards.
func (b *Backend) Set(t vtep.Table) {
	if b.fast == nil {
		b.peers.Store(newPeers(t, b.cfg.Port, b.cfg.Local.Is6()))
	}
	b.Desired.Set(t)
}

// Stats returns the frame, drop, repair and event counters; drops are
// keyed by DropReason.String().
func (b *Backend) Stats() backend.Stats { return b.addFastStats(b.ctr.stats()) }

// Config returns the configuration with its defaults filled in.
func (b *Backend) Config() Config { return b.cfg }

// Run creates (or re-attaches to) the TAP device, opens the sockets and
// moves frames until ctx is done, then returns after its goroutines exit.
// Meanwhile it repairs drift as the kernel backend does (kernel.Reconciler):
// a changed or deleted neighbour, route or address, and a deleted TAP, are
// put back on the kernel's change notification and by a full sync every
// Config.Reconcile; a failed receive socket is reopened. None of these ends
// Run. The device, its address, neighbours and routes stay in place on
// return (the TAP is persistent), so a restarting daemon keeps its routes;
// RemoveDevice deletes them. Only one Run may be active at a time.
func (b *Backend) Run(ctx context.Context) error {
	if !b.running.CompareAndSwap(false, true) {
		return errors.New("uvxlan backend: already running")
	}
	defer b.running.Store(false)
	b.noUDPGSO.Store(b.fast != nil)
	dp, err := b.open()
	if err != nil {
		return fmt.Errorf("uvxlan backend: %w", err)
	}
	b.dp.Store(dp)
	b.releaseUnused()
	loops := b.startLoops(dp)
	r := kernel.Reconciler{
		NetNS:  b.cfg.NetNS,
		Log:    b.log,
		Resync: b.cfg.Reconcile,
		Kick:   b.Kick(),
		Repair: dp.repair,
		Sync:   dp.sync,
		Drift:  dp.drift,
	}
	err = r.Run(ctx)
	dp.detachFast()
	loops.stop() // after the reconciler: it may be replacing the TAP
	if err != nil {
		return fmt.Errorf("uvxlan backend: %w", err)
	}
	return nil
}

// stopWait bounds how long Run waits for the packet loops to return after
// they stop reading, before it closes their files.
const stopWait = time.Second

// adoptedWait bounds how long the packet loops of a run that took over
// kept files wait for the first programmed table.
const adoptedWait = 10 * time.Second

// packetLoops are the egress and ingress goroutines of one Run.
type packetLoops struct {
	b     *Backend
	dp    *datapath
	start chan struct{} // closed when the loops may read
	halt  chan struct{} // closed when Run ends
	wg    sync.WaitGroup
}

// startLoops starts the packet loops of dp. They read at once, or, when dp
// took over files kept by the last run, once the first table is
// programmed (frames that waited in the queues meanwhile need their peers;
// read earlier they would be dropped as from or to unknown peers) or
// adoptedWait has passed.
func (b *Backend) startLoops(dp *datapath) *packetLoops {
	l := &packetLoops{b: b, dp: dp, start: make(chan struct{}), halt: make(chan struct{})}
	for q := range b.cfg.Queues {
		l.wg.Go(func() {
			if l.started() {
				dp.egress(q)
			}
		})
		l.wg.Go(func() {
			if l.started() {
				dp.ingress(q)
			}
		})
	}
	l.wg.Go(l.gate)
	return l
}

// started waits until the loops may read (true) or Run ends first (false).
func (l *packetLoops) started() bool {
	select {
	case <-l.start:
		return true
	case <-l.halt:
		return false
	}
}

// gate closes start when the loops may read (see startLoops), unless Run
// ends first.
func (l *packetLoops) gate() {
	if !l.dp.adopted {
		close(l.start)
		return
	}
	t := time.NewTimer(l.b.adoptedWait)
	defer t.Stop()
	select {
	case <-l.b.Ready():
		l.b.log.Info("took over the tap queues and sockets of the last run; forwarding what waited")
		close(l.start)
	case <-t.C:
		l.b.log.Warn("no peer table programmed yet; forwarding anyway", "waited", l.b.adoptedWait)
		close(l.start)
	case <-l.halt:
	}
}

// stop ends the loops and then closes dp's files. The loops stop reading
// first and forward what they read; closed under them, a loop dropped
// frames it had read: with kept files, frames that would otherwise have
// waited for the next run. Loops that have not started return without
// reading (what waits stays in the kept queues); an egress loop waiting
// for a lost TAP is woken. A loop still busy after stopWait (a send
// waiting for room in a socket buffer, a receive socket being reopened)
// has its files closed under it.
func (l *packetLoops) stop() {
	// Deadlines first: a loop that the gate starts at this very moment
	// (adoptedWait just passed) then finds its first read failing.
	l.dp.stopReading()
	close(l.halt)
	stopped := make(chan struct{})
	go func() { l.wg.Wait(); close(stopped) }()
	t := time.NewTimer(l.b.stopWait)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		l.b.log.Warn("packet loops still busy; closing their files under them", "waited", l.b.stopWait)
	}
	l.dp.close()
	<-stopped
}
