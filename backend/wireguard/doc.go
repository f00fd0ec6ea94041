// Package wireguard is the wireguard dataplane, on the wire and in the
// datastore the same as Flannel's wireguard backend, so weft and flanneld
// nodes encrypt to each other.
//
// In Mode "separate" (the default) one device per family, flannel-wg
// (UDP ListenPort, 51820) and flannel-wg-v6 (ListenPortV6, 51821); in
// "auto", "ipv4" and "ipv6" one device, flannel-wg, for both families. Each
// device gets the node's private key, its port, MTU = underlay MTU − 80, the
// address <own subnet>.0/32 (IPv6 <own subnet>::/128), and a route for the
// whole cluster Network (IPv6Network) through it:
//
//	ip route replace <Network> dev flannel-wg scope link proto 87
//
// and per peer node, keyed by the public key of its lease: endpoint
// <PublicIP>:<Port> (or the IPv6 one), allowed IPs = its subnet(s), the
// cluster's PSK and PersistentKeepaliveInterval. "auto" picks each peer's
// family as Flannel does: IPv4 unless the peer has only a public IPv6
// address and this node has one too.
//
// When the kernel has WireGuard (`ip link add type wireguard` works) the
// devices are kernel devices configured with wgctrl. Otherwise weftd runs
// WireGuard itself (wireguard-go) on a TUN device of the same name, as
// uvxlan runs VXLAN without the kernel module; the packets on the wire are
// the same. An in-process device lives as long as weftd: a restart
// re-creates it with the same key, and it starts a handshake with each peer
// it sets up (of two nodes, the one with the lower public key at once), so
// that a peer still holding a session with the last run's device does not
// keep sending into it (userDevice.Configure says why).
//
// The private key is kept in a file, $WIREGUARD_KEY_FILE or
// /run/flannel/wgkey (Flannel's), created with mode 0400 when missing, so a
// restarted node keeps its public key and its peers need no update.
//
// kernel.Reconciler syncs on every new table, on notifications about the
// devices, their addresses and routes, and every ResyncInterval (10 s by
// default): it re-creates a missing device, address or route, removes stale
// peers and sets missing or changed ones, never replacing unchanged ones
// (their sessions would drop). A `wg set` raises no notification: only the
// periodic sync repairs it.
package wireguard
