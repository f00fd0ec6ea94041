// Package vxlan is weft's kernel VXLAN dataplane: it programs a Linux VXLAN
// device per address family over netlink and lets the kernel encapsulate.
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
// Only peers reach the pods: a table `inet weft-vxlan` (written through
// backend/nft) accepts the VXLAN port only from the sets of the peers'
// public addresses, which change in the same reconcile as the routes (an
// address is added before its routes, removed after them), drops the rest
// as "not_peer", and frames out of weft.1 from outside the cluster network
// as "foreign_source" (docs/what-reaches-pods.md), in a chain on weft.1's
// ingress hook (before Linux 5.10, which refuses those, on prerouting).
//
// This is Flannel's vxlan state (same VNI, port and frame format: weft and
// flanneld nodes carry each other's pods); the entries are permanent, so
// the kernel never floods or learns.
//
// Unlike Flannel's, the device MAC is stable (vtep.DeviceMAC) and a
// compatible device is adopted, never flushed or recreated, so a restart
// drops no packet; a peer whose MAC or address changed gets its FDB entry
// replaced; drift is repaired on netlink notifications (backend/kernel's
// Reconciler). A device with our VNI and port under another name
// (flannel.1), which would make the kernel refuse ours, is removed, logged.
package vxlan
