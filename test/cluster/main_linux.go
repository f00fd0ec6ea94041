// Command cluster brings up a real multi-node Kubernetes cluster on this
// machine with weft installed as users install it, and takes it down:
//
//	test/cluster/up.sh [-nodes N] [-proxy-mode iptables|nftables] [-cni weft|flannel]
//	    [-install manifest|helm] [-backend TYPE] [-fast-path true|false] [-network-policy true|false]
//	    [-peer-filter true|false]
//	test/cluster/down.sh
//
// up builds weft's image from the Dockerfile (test/image/build.sh), starts
// the control plane and the nodes (internal/testkit/kubecluster), imports
// the image and a locally built pause image into every node's containerd
// (and every image archive in $WEFT_CACHE/images-<Kubernetes version>/),
// applies kube-manifests/kube-weft.yml with only the image tag set by a
// kustomization (or, with -install helm, installs charts/weft with the
// image set by --set), each setting of -backend, -fast-path,
// -network-policy and -peer-filter made as a user makes it (a kustomize patch of the
// net-conf.json ConfigMap or of weftd's args; --set of the chart's
// value), waits until every node is Ready and weft runs on each,
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
		fmt.Fprintln(os.Stderr, "usage: cluster up [-nodes N] [-proxy-mode M] [-cni weft|flannel] [-install manifest|helm] [-backend T] [-fast-path B] [-network-policy B] [-peer-filter B] | down  (state in $WEFT_CLUSTER_DIR, default "+defaultDir+
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
	fs.StringVar(&o.Install, "install", "manifest", "how weft is installed: manifest (kubectl apply -k of kube-manifests/kube-weft.yml) or helm (charts/weft)")
	fs.StringVar(&o.Backend, "backend", "", "Backend.Type in net-conf.json (weft: vxlan, uvxlan, host-gw, wireguard; flannel: vxlan, host-gw, wireguard); default: the manifest's or chart's (vxlan)")
	fs.StringVar(&o.FastPath, "fast-path", "", "weft's uvxlan Backend.FastPath in net-conf.json, true or false; default: unset (on)")
	fs.StringVar(&o.NetworkPolicy, "network-policy", "", "false adds --network-policy=false to weftd's args; default: unset (on)")
	fs.StringVar(&o.PeerFilter, "peer-filter", "", "false adds --vxlan-peer-filter=false to weftd's args; default: unset (on)")
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
