// Package ipip is the ipip dataplane, as Flannel's ipip backend: pod traffic
// to another node is carried in IPv4-in-IPv4 packets (IP protocol 4) through
// the kernel's IPIP tunnel. IPv4 only.
//
// # What it programs
//
// One tunnel device, named as Flannel names it so that a node taken over
// from flanneld keeps its device:
//
//	ip link add flannel.ipip type ipip local <underlay IPv4>   (remote any)
//	ip addr add <subnet>.0/32 dev flannel.ipip
//	ip link set flannel.ipip mtu <underlay MTU - 20> up
//
// The address gives traffic from this host to pods elsewhere a source
// address inside the cluster network. Then per remote node subnet in the
// table:
//
//	ip route replace <subnet> via <peer PublicIP> dev flannel.ipip onlink proto 87
//
// An IPIP tunnel has no link layer: the kernel takes the outer destination
// from the route's gateway, so there are no neighbours and no FDB. With
// DirectRouting, a peer whose public address is on-link (on this node's L2
// segment) is routed as host-gw does instead, `via <PublicIP>` over the
// underlay with no encapsulation. The lease is Flannel's for ipip:
// BackendType "ipip", the public address, no backend data. Leases of other
// backend types are not peers.
//
// # Repair
//
// kernel.Reconciler runs the sync on every new table, when the device or
// one of weft's routes is deleted or changed, when another owner writes a
// route to a peer subnet, on any change of the underlay device or its
// addresses (with DirectRouting a peer may become on-link or stop being),
// and every ResyncInterval. A device deleted or made incompatible (another
// type, another local address) is recreated and counted in
// Stats().Repairs["device"]; a repaired route in Stats().Repairs["route"].
//
// The kernel needs IPIP support (CONFIG_NET_IPIP, module ipip); without it
// Run fails with that hint.
package ipip
