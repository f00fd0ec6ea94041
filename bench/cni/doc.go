// Package cni benchmarks weft's CNI plugin against the Flannel-style
// reference chain (the reference bridge plugin with host-local IPAM), both
// executed through libcni with the node being a test network namespace.
// Run it with run.sh (needs root and the reference plugins).
package cni
