// Package subnet holds weft's control-plane data: the network config, the
// per-node lease and its Flannel-compatible key and value codecs, the subnet
// file read by the CNI plugin, and the Registry interface that the etcd and
// Kubernetes datastores implement.
//
// It imports no other weft package, so the plugin, the registries, the
// backends and the daemon can all share it.
package subnet
