// Package hostgw is the host-gw dataplane, as Flannel's host-gw backend:
// no tunnel and no device of its own; each remote node's subnet is routed
// via that node's public address over the underlay.
//
// # What it programs
//
// Per remote node subnet in the table (IPv4 and IPv6 alike):
//
//	ip route replace <subnet> via <peer PublicIP> proto 87
//
// which the kernel sends out of the underlay device the peer is on. The lease
// the node writes is Flannel's for host-gw: BackendType "host-gw", the public
// addresses, and no backend data; the MTU of pods is the underlay's.
//
// # Peers on another segment
//
// host-gw works only between nodes on one L2 segment: the peer's public
// address must be on-link (the kernel reaches it with no gateway). For a peer
// that is not, a route via its address would be refused by the kernel or
// silently send pod traffic to a router that knows nothing of pod subnets.
// This backend programs no route for such a peer; it logs it once when it
// becomes unreachable (and again when it becomes reachable), counts it
// (Stats().Events["peer_off_link"]), and lists it (OffLink), and
// `weftctl peers` shows it as off-link.
//
// # What it accepts
//
// host-gw has no tunnel to check: what the L2 segment delivers to the node
// reaches the pods. With the cluster Network set (weftd always sets it),
// the backend keeps table inet weft-hostgw (written with backend/nft):
// a packet that arrives on the underlay device with a source in the
// Network (IPv6Network) whose subnet is no current peer's is dropped and
// counted (Stats().Drops["not_peer_subnet"], rule "weft: pod-network
// source in no peer's subnet"). That catches this node's own pod
// addresses and unleased subnets coming from the wire. The set of peer
// subnets (by their first address: the source is masked with the subnet
// length, one hash lookup) changes in the same sync as the routes: a
// joining peer's subnet is in before its route, a departed one's goes after.
//
// What it does not catch: a host on the segment sending with a source in a
// peer's subnet. Tying a subnet to its sender would need the sender's MAC,
// which the neighbour table learns from the same wire (ARP and neighbour
// discovery answers anyone can send), and a check against it would drop a
// peer's traffic whenever its entry is stale or missing; it would not stop
// a host that can spoof a source address, which can spoof a MAC as well.
// Only the segment's own protection (port security, a private VLAN) keeps
// such hosts out.
//
// # Repair
//
// The routes are kernel.Overlay's direct routes (DirectOnly: it owns no
// link, so it reads and removes only weft's own routes, RouteProtocol 87,
// never the underlay's neighbours or other routes). kernel.Reconciler runs
// the sync on every new table, on a deleted or changed route of weft's, on
// another owner's route to a peer subnet (it may have replaced weft's), on
// any change of the underlay device or its addresses (a peer may become
// on-link or stop being), and every ResyncInterval (90 s by default); a
// repaired route is counted in Stats().Repairs["route"].
package hostgw
