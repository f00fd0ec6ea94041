// Package inspect reads weft's live state for people: the leases in the
// datastore, what a node has programmed on its overlay device (read from the
// kernel of the namespace it runs in), how that compares with the leases,
// and the path a packet takes from one pod address to another.
//
// It only reads. weftctl uses it on real nodes, and the lab uses it on its
// node namespaces through netlink handles bound to them.
package inspect
