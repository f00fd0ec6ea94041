// Package vxlan is weft's kernel VXLAN dataplane: it programs a Linux VXLAN
// device per address family over netlink and lets the kernel encapsulate.
//
// # What it programs
//
// One device per family, named weft.<VNI> (IPv6: weft-v6.<VNI>):
//
//	ip link add weft.1 type vxlan id 1 local <PublicIP> dev <underlay> dstport 8472 nolearning
//	ip link set weft.1 address <VtepMAC> mtu <underlay MTU − 50> up
//	ip addr add <own subnet>.0/32 dev weft.1
//
// and per remote node subnet in the table, in this order (kernel.Overlay
// writes the neighbour and the route, this package's FDB step sits between):
//
//	ip neigh replace <subnet>.0 lladdr <VtepMAC> dev weft.1 nud permanent
//	bridge fdb replace <VtepMAC> dev weft.1 dst <PublicIP> self permanent
//	ip route replace <subnet> via <subnet>.0 dev weft.1 onlink proto 87
//
// Routes have the kernel's default metric, as Flannel's do, so a route
// flanneld left in place is replaced, not outranked. A peer leaves in the
// reverse order. With DirectRouting, a peer whose public address is on-link
// gets only `ip route replace <subnet> via <PublicIP>`.
//
// # Only peers reach the pods
//
// The kernel's VXLAN socket takes a datagram from any host. So that only
// peers can put frames into pods, the backend keeps an nftables table of its
// own (package backend/nft writes it, as masq writes its tables):
//
//	table inet weft-vxlan {
//		set peers { type ipv4_addr }      (the peers' public IPv4 addresses)
//		set peers-v6 { type ipv6_addr }   (and IPv6 ones)
//		chain input { type filter hook input priority filter
//			udp dport <Port> ip saddr @peers accept
//			udp dport <Port> ip6 saddr @peers-v6 accept
//			udp dport <Port> counter drop comment "weft: vxlan from a non-peer"
//		}
//		chain prerouting { type filter hook prerouting priority raw
//			iifname weft.1 ip saddr != <Network> counter drop comment "weft: overlay source outside the cluster network"
//			iifname weft-v6.1 ip6 saddr != <IPv6Network> counter drop (same comment)
//		}
//	}
//
// The sets change in the same reconcile as the routes: a new peer's
// address is added before any route is written, so its first packet is
// taken, and a departed peer's goes once its routes are gone. Every peer of
// the table is in them, directly routed or not. Stats reports the two drop
// counters as drops "not_peer" and "foreign_source", the reasons uvxlan
// counts the same drops under. The full resync checks the table and its
// sets and rewrites them, in one transaction with the elements, when
// someone changed them (counted as repairs "filter"). A kernel without
// nf_tables gets no filter, which Run logs when it starts;
// Config.NoPeerFilter turns it off and removes a table left from before.
// Backend.AllowForeignSources (Config.AllowForeignSources) leaves out the
// prerouting chain. Inner sources are checked against the cluster network
// only, not against the subnet of the peer that sent the frame (uvxlan
// checks that too).
//
// # Why this way
//
// This is the state Flannel's vxlan backend programs, with the same VNI,
// port and frame format, so weft and flanneld nodes carry each other's pod
// traffic. The permanent neighbour and FDB entries mean the kernel never
// floods or asks: the route picks the peer's gateway address, the neighbour
// gives its VTEP MAC, and the FDB maps that MAC to the peer's underlay
// address. Nothing is learned from the wire (nolearning), so a spoofed frame
// cannot redirect traffic.
//
// Where weft differs from Flannel: the device MAC is stable (derived from the
// public address, see vtep.DeviceMAC) and an existing compatible device is
// adopted, never flushed or recreated, so restarting weftd drops no packet
// and peers' FDB entries stay right; a peer whose MAC or address changed gets
// its FDB entry replaced instead of leaving the old one behind; and the state
// is reconciled continuously: on netlink change notifications a deleted
// route, neighbour, FDB entry or even the whole device is repaired within
// about a second, and a full resync runs every ResyncInterval (90 s by
// default). Writes go over a netlink socket of the backend's own
// (kernel.BatchWriter): windows of requests with one acknowledgement each.
// A device that uses our VNI and port under another name (flannel.1 left by
// flanneld) would make the kernel refuse ours, so it is removed, with a log
// line.
package vxlan
