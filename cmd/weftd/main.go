// Command weftd is weft's node daemon: it leases this node's pod subnet from
// etcd or the Kubernetes API, writes the subnet file for the CNI plugin, and
// programs the dataplane (vxlan, uvxlan, host-gw, wireguard, extension or
// alloc) towards every other node. It takes flanneld's command line as it
// is; see internal/daemon.
package main

import "github.com/weft-net/weft/internal/daemon"

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() { daemon.Main(version) }
