// Package connectivity measures whether and how fast addresses reach each
// other over a weft overlay: ICMP echo with loss and round trip, then
// (when small ones come back) with DF set at the MTU of the source's route,
// which tells an MTU black hole (the large probes vanish) from a smaller
// path MTU that the path reports ("fragmentation needed"), and a short TCP
// exchange, both from sockets opened inside a chosen network namespace.
// It builds the matrix that `weftctl connectivity` prints and the lab's
// pod-to-pod check, and it wires short-lived probe namespaces through the
// weft CNI plugin on a node, as a container runtime does.
package connectivity
