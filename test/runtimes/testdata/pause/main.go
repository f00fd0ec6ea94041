// Command pause is the sandbox process of the CRI tests' pod sandboxes: it
// holds the pod's namespaces and exits on SIGTERM or SIGINT, like the
// Kubernetes pause image (which cannot be pulled here).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
