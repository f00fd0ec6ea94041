package vxlan

import (
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// watch holds the link, neighbour and route change subscriptions of one
// namespace. Its channels close when the subscription fails or is closed.
type watch struct {
	links  chan netlink.LinkUpdate
	neighs chan netlink.NeighUpdate
	routes chan netlink.RouteUpdate
	done   chan struct{}
}

// notifyBuffer is the receive buffer of the neighbour and route
// subscriptions: programming thousands of peers at once makes a burst of
// notifications that overflows the default buffer (ENOBUFS), which forces a
// resubscription and a full resync.
const notifyBuffer = 8 << 20

// subscribe opens the three subscriptions in the namespace at path (""
// means the current one).
func subscribe(path string, log *slog.Logger) (*watch, error) {
	w := &watch{
		links:  make(chan netlink.LinkUpdate, 64),
		neighs: make(chan netlink.NeighUpdate, 4096),
		routes: make(chan netlink.RouteUpdate, 4096),
		done:   make(chan struct{}),
	}
	var nsh *netns.NsHandle
	if path != "" {
		h, err := netns.GetFromPath(path)
		if err != nil {
			return nil, fmt.Errorf("open namespace %s: %w", path, err)
		}
		defer h.Close()
		nsh = &h
	}
	cberr := func(err error) {
		select {
		case <-w.done: // the socket was closed on purpose
		default:
			log.Warn("netlink subscription error", "err", err)
		}
	}
	// Each subscription's channel is closed by netlink when it ends; a
	// failed subscribe leaves it open, so close it here to keep close()
	// simple.
	if err := netlink.LinkSubscribeWithOptions(w.links, w.done, netlink.LinkSubscribeOptions{Namespace: nsh, ErrorCallback: cberr}); err != nil {
		close(w.links)
		close(w.neighs)
		close(w.routes)
		w.close()
		return nil, fmt.Errorf("subscribe to links: %w", err)
	}
	if err := netlink.NeighSubscribeWithOptions(w.neighs, w.done, netlink.NeighSubscribeOptions{Namespace: nsh, ErrorCallback: cberr,
		ReceiveBufferSize: notifyBuffer, ReceiveBufferForceSize: true}); err != nil {
		close(w.neighs)
		close(w.routes)
		w.close()
		return nil, fmt.Errorf("subscribe to neighbours: %w", err)
	}
	if err := netlink.RouteSubscribeWithOptions(w.routes, w.done, netlink.RouteSubscribeOptions{Namespace: nsh, ErrorCallback: cberr,
		ReceiveBufferSize: notifyBuffer, ReceiveBufferForceSize: true}); err != nil {
		close(w.routes)
		w.close()
		return nil, fmt.Errorf("subscribe to routes: %w", err)
	}
	return w, nil
}

// close ends the subscriptions and returns once their goroutines have
// delivered their last update. A nil channel (an empty watch) is skipped.
func (w *watch) close() {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
	if w.links != nil {
		for range w.links {
		}
	}
	if w.neighs != nil {
		for range w.neighs {
		}
	}
	if w.routes != nil {
		for range w.routes {
		}
	}
}

// relevance decides whether a change notification is drift that calls for a
// full reconcile: anything on the backend's links, a deleted neighbour, FDB
// entry or route that the programmed table wants, or a new one that differs
// from it. The backend's own writes match the table it just programmed, so
// they do not trigger a reconcile of thousands of peers.
type relevance struct {
	index  map[int]bool
	name   map[string]bool
	neighs map[netip.Addr]subnet.MAC // gateway → VTEP MAC
	fdb    map[fdbEntry]bool
	routes map[netip.Prefix]vtep.VTEP
}

func (r relevance) link(u netlink.LinkUpdate) bool {
	return r.index[int(u.Index)] || u.Link != nil && r.name[u.Link.Attrs().Name]
}

func (r relevance) neigh(u netlink.NeighUpdate) bool {
	if !r.index[u.LinkIndex] {
		return false
	}
	ip, _ := netip.AddrFromSlice(u.IP)
	ip = ip.Unmap()
	var mac subnet.MAC
	copy(mac[:], u.HardwareAddr)
	if u.Family == unix.AF_BRIDGE {
		want := r.fdb[fdbEntry{MAC: mac, Dst: ip}]
		if u.Type == unix.RTM_DELNEIGH {
			return want
		}
		return u.State&netlink.NUD_PERMANENT != 0 && !want
	}
	wantMAC, want := r.neighs[ip]
	if u.Type == unix.RTM_DELNEIGH {
		return want
	}
	return u.State&netlink.NUD_PERMANENT != 0 && (!want || wantMAC != mac)
}

func (r relevance) route(u netlink.RouteUpdate) bool {
	if !r.index[u.LinkIndex] && u.Protocol != backend.RouteProtocol {
		return false
	}
	if u.Dst == nil {
		return u.Type == unix.RTM_DELROUTE
	}
	ones, _ := u.Dst.Mask.Size()
	dst, _ := netip.AddrFromSlice(u.Dst.IP)
	p := netip.PrefixFrom(dst.Unmap(), ones)
	v, want := r.routes[p]
	if u.Type == unix.RTM_DELROUTE {
		return want
	}
	gw, _ := netip.AddrFromSlice(u.Gw)
	gw = gw.Unmap()
	return !want || (gw != backend.Gateway(p) && gw != v.Addr)
}
