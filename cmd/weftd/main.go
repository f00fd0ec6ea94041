// Command weftd is weft's node daemon: it leases this node's pod subnet from
// etcd or the Kubernetes API, writes the subnet file for the CNI plugin, and
// programs the VXLAN dataplane towards every other node. This build has no
// Kubernetes client: with --kube-subnet-mgr it runs weftd-kube (cmd/weftd-kube)
// from its own directory in its place.
package main

import "github.com/weft-net/weft/internal/weftd"

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() { weftd.Main(weftd.Options{Version: version}) }
