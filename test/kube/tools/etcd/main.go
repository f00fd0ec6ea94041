// Command etcd is the real etcd server, built at the version k8s.io/kubernetes
// requires, so the tests' API server runs against the etcd it is released with.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
