// Package cni benchmarks weft's CNI plugin against the Flannel-style
// reference chain (the reference bridge plugin with host-local IPAM) and,
// when WEFT_BENCH_FLANNEL_CNI names a built flannel CNI plugin, against
// Flannel's own chain (flannel → bridge → host-local), all executed as
// processes through libcni with the node being a test network namespace,
// interleaved in one run. It reports cycles per second, mean ADD and DEL
// (each DEL includes the kernel's deletion of the veth pair, which it waits
// for), and the share of each cycle that is the kernel's veth creation and
// deletion.
// Run it with run.sh (needs root and the reference plugins).
package cni
