// Command cluster brings up a real multi-node Kubernetes cluster on this
// machine with weft installed as users install it, and takes it down:
//
//	test/cluster/up.sh [-nodes N] [-proxy-mode iptables|nftables] [-cni weft|flannel] [-backend TYPE]
//	test/cluster/down.sh
//
// up builds weft's image from the Dockerfile (test/image/build.sh), starts
// the control plane and the nodes (internal/testkit/kubecluster), imports
// the image and a locally built pause image into every node's containerd
// (and every image archive in $WEFT_CACHE/images-<Kubernetes version>/),
// applies kube-manifests/kube-weft.yml with only the image tag set by a
// kustomization, waits until every node is Ready and weft runs on each,
// prints the admin kubeconfig's path and exits, leaving the cluster
// running. With -cni flannel it installs Flannel instead, by Flannel's own
// kube-flannel.yml at FLANNEL_VERSION with images built here
// (test/cluster/flannel-images.sh) and -backend vxlan (the default),
// host-gw or wireguard in its net-conf.json. down stops it, removes
// everything up made and checks that nothing of it is left.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/weft-net/weft/internal/testkit/kubecluster"
)

func main() {
	kubecluster.MaybeForward()
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cluster up [-nodes N] [-proxy-mode M] [-cni weft|flannel] [-backend B] | down  (state in $WEFT_CLUSTER_DIR, default "+defaultDir+
			"; namespaces and cgroups named "+kubecluster.NamePrefix("<$WEFT_CLUSTER_NAME, default "+defaultName+">")+"…)")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "up":
		err = up(os.Args[2:])
	case "down":
		if err = kubecluster.Down(stateDir()); err == nil {
			err = kubecluster.Leftovers(stateDir(), clusterName(), nil)
		}
	default:
		err = fmt.Errorf("unknown command %q: want up or down", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

func up(args []string) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	o := options{Dir: stateDir(), Name: clusterName()}
	fs.IntVar(&o.Nodes, "nodes", 3, "worker nodes")
	fs.StringVar(&o.ProxyMode, "proxy-mode", "iptables", "kube-proxy mode: iptables or nftables")
	fs.StringVar(&o.CNI, "cni", "weft", "pod network: weft, or flannel (Flannel's own manifest)")
	fs.StringVar(&o.Backend, "backend", "", "the pod network's backend (flannel: vxlan, the default, host-gw or wireguard)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s, err := bringUp(ctx, o, os.Stderr)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "cluster: up in %s; take it down with test/cluster/down.sh\n", time.Since(start).Round(time.Second))
	fmt.Println(s.Kubeconfig)
	return nil
}
