package flows

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/weft-net/weft/internal/ops/kuberest"
)

// Kube reaches every node's weftd in a Kubernetes cluster: weftd runs
// on the host network and serves on the node's loopback, so Kube
// port-forwards (the API server and kubelet, as kubectl port-forward
// does) to the health port of each weftd pod, found in Namespace by
// Selector (kube-manifests/kube-weft.yml: kube-weft, k8s-app=weft).
type Kube struct {
	Config    *rest.Config
	Namespace string
	Selector  string
	Port      int // weftd's health port (9470)
}

// Endpoints opens a port forward to each weftd pod and returns the nodes'
// endpoints, the pods' names by address, and the function that closes the
// forwards.
func (k Kube) Endpoints(ctx context.Context) ([]Endpoint, Names, func(), error) {
	scheme, err := kuberest.Scheme(corev1.AddToScheme)
	if err != nil {
		return nil, nil, nil, err
	}
	core, err := kuberest.Client(k.Config, scheme, "/api", corev1.SchemeGroupVersion)
	if err != nil {
		return nil, nil, nil, err
	}
	var weftd, all corev1.PodList
	if err := core.Get().Namespace(k.Namespace).Resource("pods").Param("labelSelector", k.Selector).Do(ctx).Into(&weftd); err != nil {
		return nil, nil, nil, fmt.Errorf("weftd pods in %s (%s): %w", k.Namespace, k.Selector, err)
	}
	if len(weftd.Items) == 0 {
		return nil, nil, nil, fmt.Errorf("no weftd pods in %s with %s", k.Namespace, k.Selector)
	}
	names := Names{}
	if err := core.Get().Resource("pods").Do(ctx).Into(&all); err == nil {
		for _, p := range all.Items {
			for _, ip := range p.Status.PodIPs {
				if a, err := netip.ParseAddr(ip.IP); err == nil && !p.Spec.HostNetwork {
					names[a] = p.Namespace + "/" + p.Name
				}
			}
		}
	}
	var eps []Endpoint
	var stops []chan struct{}
	closeAll := func() {
		for _, s := range stops {
			close(s)
		}
	}
	for _, p := range weftd.Items {
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		stop := make(chan struct{})
		port, err := k.forward(core, p.Name, stop)
		if err != nil {
			close(stop)
			closeAll()
			return nil, nil, nil, fmt.Errorf("node %s (pod %s): %w", p.Spec.NodeName, p.Name, err)
		}
		stops = append(stops, stop)
		eps = append(eps, Endpoint{Node: p.Spec.NodeName, Client: &http.Client{}, Base: "http://127.0.0.1:" + strconv.Itoa(int(port))})
	}
	return eps, names, closeAll, nil
}

// forward opens a port forward from a free port of this host's loopback to
// the pod's health port.
func (k Kube) forward(core *rest.RESTClient, pod string, stop chan struct{}) (uint16, error) {
	rt, upgrader, err := spdy.RoundTripperFor(k.Config)
	if err != nil {
		return 0, err
	}
	u := core.Post().Namespace(k.Namespace).Resource("pods").Name(pod).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	ready := make(chan struct{})
	pf, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(k.Port)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		return 0, err
	}
	errc := make(chan error, 1)
	go func() { errc <- pf.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-errc:
		return 0, fmt.Errorf("port forward: %w", err)
	case <-time.After(30 * time.Second):
		return 0, fmt.Errorf("port forward: not ready after 30s")
	}
	ports, err := pf.GetPorts()
	if err != nil || len(ports) == 0 {
		return 0, fmt.Errorf("port forward: %v", err)
	}
	return ports[0].Local, nil
}
