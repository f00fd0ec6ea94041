// Command weftd-kube is weftd with the Kubernetes client: the same daemon,
// flags and behaviour, able to run with --kube-subnet-mgr. weftd runs it in
// its own place when started in Kubernetes mode; the image holds both.
package main

import "github.com/weft-net/weft/internal/weftd"

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() { weftd.Main(weftd.Options{Version: version, Kube: newKubeRegistry}) }
