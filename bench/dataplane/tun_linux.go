package main

import (
	"fmt"
	"log/slog"

	"github.com/weft-net/weft/bench/dataplane/tunpath"
	"github.com/weft-net/weft/vtep"
)

// newTUNNode is a node process's tunpath node (mode uvxlan-tun-proc).
func newTUNNode(s nodeSpec) (*tunpath.Node, error) {
	if s.Queues > 1 || s.FastPath {
		return nil, fmt.Errorf("tunpath: %d queues, fast path %v: it has one queue and no fast path", s.Queues, s.FastPath)
	}
	return tunpath.New(tunpath.Config{NetNS: s.NetNS, Local: s.Local, Subnet: s.Subnet, MTU: overlayMTU,
		Peers: []tunpath.Peer{{Subnet: s.PeerSubnet, Addr: s.PeerAddr, MAC: vtep.DeviceMAC(s.PeerAddr, 1)}}},
		slog.New(slog.DiscardHandler))
}

// tunProcessVXLAN runs each host's tunpath node (a TUN-based userspace
// VXLAN prototype) in a process of its own, as uvxlan-proc runs uvxlan.
func (t *topology) tunProcessVXLAN(queues int) error {
	for _, p := range [][2]*node{{t.a, t.b}, {t.b, t.a}} {
		n, peer := p[0], p[1]
		np, err := startNodeSpec(nodeSpec{NetNS: n.host.Path, Local: n.addr, Subnet: n.subnet,
			PeerAddr: peer.addr, PeerSubnet: peer.subnet, Queues: queues, TUN: true})
		if err != nil {
			return err
		}
		t.addProc(np)
	}
	return nil
}
