// Package runtimes tests weft under real container runtimes on plain
// hosts sharing one etcd: Docker (configured by `weftctl docker-opts`),
// Podman and containerd through CRI (both through weft's CNI conflist).
// Every host is a network namespace on one underlay running the real
// weftd, as in test/e2e; each runtime runs inside its host's namespace with
// private state, and every image is built locally from busybox-static.
package runtimes
