// Package hostgw is the host-gw dataplane, as Flannel's host-gw backend:
// no tunnel and no device of its own; each remote node's subnet is routed
// via that node's public address over the underlay:
//
//	ip route replace <subnet> via <peer PublicIP> proto 87
//
// for IPv4 and IPv6 alike. The lease is Flannel's for host-gw: BackendType
// "host-gw", the public addresses, no backend data; pods get the
// underlay's MTU.
//
// host-gw works only between nodes on one L2 segment: a peer whose public
// address is not on-link gets no route (the kernel would refuse it, or a
// router would get pod traffic it cannot deliver). The backend logs such a
// peer when it goes off-link or comes back, counts it
// (Stats().Events["peer_off_link"]) and lists it (OffLink, shown by
// `weftctl peers`).
//
// With the cluster Network set (weftd always sets it) the backend keeps
// table inet weft-hostgw (through backend/nft): a packet from the underlay
// with a source in the Network (IPv6Network) whose subnet is no current
// peer's is dropped and counted (Stats().Drops["not_peer_subnet"]). The
// set of peer subnets changes in the same sync as the routes: a joining
// peer's subnet is in before its route, a departed one's goes after. A host
// on the segment sending with a source in a peer's subnet is not caught
// (docs/what-reaches-pods.md says why).
//
// The routes are kernel.Overlay's direct routes (DirectOnly: it owns no
// link and touches only routes of protocol 87). kernel.Reconciler syncs
// them on every new table, on a change to one of weft's routes or to
// another owner's route to a peer subnet, on any change of the underlay
// device or its addresses, and every ResyncInterval (90 s by default); a
// repaired route is counted in Stats().Repairs["route"].
package hostgw
