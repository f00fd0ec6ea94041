package kube_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/testlog"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/kube"
)

const prefix = kube.DefaultAnnotationPrefix + "/"

// testlog.Buffer collects a registry's log lines.

// env is one control plane shared by the subtests of a test.
type env struct {
	cluster *kubetest.Cluster
	client  kubernetes.Interface
	netConf string // path of a net-conf.json for 10.244.0.0/16
}

func newEnv(t *testing.T) *env {
	c := kubetest.Start(t)
	return &env{cluster: c, client: c.Client, netConf: writeNetConf(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`)}
}

func writeNetConf(t *testing.T, js string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "net-conf.json")
	if err := os.WriteFile(p, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *env) registry(t *testing.T, node, netConf string) (*kube.Registry, *testlog.Buffer) {
	t.Helper()
	return e.registryWith(t, kube.Options{NodeName: node, ConfigFile: netConf})
}

// registryWith is a registry with opts (and a short podCIDR poll).
func (e *env) registryWith(t *testing.T, opts kube.Options) (*kube.Registry, *testlog.Buffer) {
	t.Helper()
	logs := &testlog.Buffer{}
	nodes, err := kube.NewClientForConfig(e.cluster.Admin) // weftd's own Node client, against the real API server
	if err != nil {
		t.Fatal(err)
	}
	opts.PodCIDRPoll = 50 * time.Millisecond
	r, err := kube.New(nodes, opts, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	return r, logs
}

func (e *env) createNode(t *testing.T, name string, ann map[string]string, podCIDR string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}}
	if podCIDR != "" {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDR, []string{podCIDR}
	}
	if _, err := e.client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
}

func (e *env) node(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *env) annotate(t *testing.T, name string, ann map[string]any) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if _, err := e.client.CoreV1().Nodes().Patch(context.Background(), name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("annotate node %s: %v", name, err)
	}
}

func vxlanAttrs(ip string, mac byte) subnet.LeaseAttrs {
	return subnet.LeaseAttrs{
		PublicIP:    netip.MustParseAddr(ip),
		BackendType: subnet.BackendTypeVXLAN,
		BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: subnet.MAC{0x4e, 0xfb, 0x7d, 0xbf, 0x6b, mac}},
	}
}

func TestRegistry(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The controller-manager is not running yet: a node gets no podCIDR and
	// Acquire waits until Kubernetes assigns one.
	t.Run("acquire waits for the podCIDR that nodeipam assigns", func(t *testing.T) {
		e.createNode(t, "node-a", nil, "")
		r, logs := e.registry(t, "node-a", e.netConf)
		type result struct {
			l   subnet.Lease
			err error
		}
		done := make(chan result, 1)
		go func() {
			l, err := r.Acquire(ctx, vxlanAttrs("192.168.77.1", 0x2d), netip.Prefix{})
			done <- result{l, err}
		}()
		select {
		case res := <-done:
			t.Fatalf("Acquire returned before any podCIDR was assigned: %+v, %v", res.l, res.err)
		case <-time.After(1500 * time.Millisecond):
		}
		if !strings.Contains(logs.String(), "waiting for node node-a to get a podCIDR") {
			t.Errorf("no waiting log line; logs:\n%s", logs)
		}
		e.cluster.StartControllerManager(t)
		var res result
		select {
		case res = <-done:
		case <-time.After(90 * time.Second):
			t.Fatal("Acquire did not return within 90 s of starting the controller-manager")
		}
		if res.err != nil {
			t.Fatalf("Acquire: %v", res.err)
		}
		n := e.node(t, "node-a")
		if n.Spec.PodCIDR == "" || res.l.Subnet.String() != n.Spec.PodCIDR {
			t.Fatalf("lease subnet %s, node podCIDR %q", res.l.Subnet, n.Spec.PodCIDR)
		}
		if !netip.MustParsePrefix(kubetest.ClusterCIDR).Contains(res.l.Subnet.Addr()) || res.l.Subnet.Bits() != kubetest.NodeMaskSize {
			t.Fatalf("lease subnet %s is not a /%d of %s", res.l.Subnet, kubetest.NodeMaskSize, kubetest.ClusterCIDR)
		}
		if !res.l.Expiration.IsZero() {
			t.Errorf("lease expires at %v; Kubernetes leases do not expire", res.l.Expiration)
		}
	})

	t.Run("acquire writes Flannel's annotations once", func(t *testing.T) {
		n := e.node(t, "node-a")
		want := map[string]string{
			prefix + "backend-type":        "vxlan",
			prefix + "backend-data":        `{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:2d"}`,
			prefix + "public-ip":           "192.168.77.1",
			prefix + "kube-subnet-manager": "true",
		}
		for k, v := range want {
			if got := n.Annotations[k]; got != v {
				t.Errorf("annotation %s = %q, want %q", k, got, v)
			}
		}
		for _, k := range []string{prefix + "backend-v6-data", prefix + "public-ipv6"} {
			if v, ok := n.Annotations[k]; ok {
				t.Errorf("IPv4-only node has %s=%q", k, v)
			}
		}
		r, _ := e.registry(t, "node-a", e.netConf)
		if _, err := r.Acquire(ctx, vxlanAttrs("192.168.77.1", 0x2d), netip.Prefix{}); err != nil {
			t.Fatal(err)
		}
		if rv := e.node(t, "node-a").ResourceVersion; rv != n.ResourceVersion {
			t.Errorf("a second Acquire with the same attrs wrote the node (resourceVersion %s → %s)", n.ResourceVersion, rv)
		}
	})

	t.Run("public-ip-overwrite wins and is returned", func(t *testing.T) {
		e.createNode(t, "node-o", map[string]string{prefix + "public-ip-overwrite": "10.9.8.7"}, "")
		r, _ := e.registry(t, "node-o", e.netConf)
		l, err := r.Acquire(ctx, vxlanAttrs("192.168.77.9", 0x09), netip.Prefix{})
		if err != nil {
			t.Fatal(err)
		}
		if l.Attrs.PublicIP != netip.MustParseAddr("10.9.8.7") {
			t.Errorf("lease public IP %s, want the overwrite 10.9.8.7", l.Attrs.PublicIP)
		}
		if got := e.node(t, "node-o").Annotations[prefix+"public-ip"]; got != "10.9.8.7" {
			t.Errorf("public-ip annotation %q, want 10.9.8.7", got)
		}
	})

	t.Run("node-public-ip that is not an address is a clear error", func(t *testing.T) {
		e.createNode(t, "node-p", map[string]string{prefix + "node-public-ipv6": "192.168.77.6"}, "")
		r, _ := e.registry(t, "node-p", e.netConf)
		_, _, err := r.NodePublicIPs(ctx)
		if err == nil || !strings.Contains(err.Error(), prefix+"node-public-ipv6") {
			t.Fatalf("NodePublicIPs: %v; want an error naming the annotation", err)
		}
	})

	t.Run("podCIDR outside the network is a clear error", func(t *testing.T) {
		e.createNode(t, "node-x", nil, "10.99.3.0/24")
		r, _ := e.registry(t, "node-x", e.netConf)
		_, err := r.Acquire(ctx, vxlanAttrs("192.168.77.3", 0x03), netip.Prefix{})
		if err == nil || !strings.Contains(err.Error(), "podCIDR 10.99.3.0/24 is outside the network 10.244.0.0/16") {
			t.Fatalf("Acquire: %v; want an error naming the podCIDR and the network", err)
		}
		if _, ok := e.node(t, "node-x").Annotations[prefix+"kube-subnet-manager"]; ok {
			t.Error("a node with a foreign podCIDR was annotated")
		}
	})

	t.Run("IPv6 enabled but no IPv6 podCIDR is a clear error", func(t *testing.T) {
		conf := writeNetConf(t, `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`)
		r, _ := e.registry(t, "node-a", conf)
		attrs := vxlanAttrs("192.168.77.1", 0x2d)
		attrs.PublicIPv6 = netip.MustParseAddr("fd77::1")
		_, err := r.Acquire(ctx, attrs, netip.Prefix{})
		if err == nil || !strings.Contains(err.Error(), "has no IPv6 podCIDR") {
			t.Fatalf("Acquire: %v; want a missing IPv6 podCIDR error", err)
		}
	})

	t.Run("dual stack writes the IPv6 annotations too", func(t *testing.T) {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-d"}}
		n.Spec.PodCIDR, n.Spec.PodCIDRs = "10.244.200.0/24", []string{"10.244.200.0/24", "fd00:10:244:c8::/64"}
		if _, err := e.client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		conf := writeNetConf(t, `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`)
		r, _ := e.registry(t, "node-d", conf)
		attrs := vxlanAttrs("192.168.77.4", 0x04)
		attrs.PublicIPv6 = netip.MustParseAddr("fd77::4")
		attrs.BackendV6Data = &subnet.VXLANData{VNI: 1, VtepMAC: subnet.MAC{0x4e, 0xfb, 0x7d, 0xbf, 0x6b, 0x64}}
		l, err := r.Acquire(ctx, attrs, netip.Prefix{})
		if err != nil {
			t.Fatal(err)
		}
		if l.Subnet.String() != "10.244.200.0/24" || l.IPv6Subnet.String() != "fd00:10:244:c8::/64" {
			t.Errorf("lease subnets %s %s", l.Subnet, l.IPv6Subnet)
		}
		got := e.node(t, "node-d").Annotations
		for k, v := range map[string]string{
			prefix + "backend-data":    `{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:04"}`,
			prefix + "backend-v6-data": `{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:64"}`,
			prefix + "public-ip":       "192.168.77.4",
			prefix + "public-ipv6":     "fd77::4",
		} {
			if got[k] != v {
				t.Errorf("annotation %s = %q, want %q", k, got[k], v)
			}
		}
	})

	t.Run("network available condition", func(t *testing.T) {
		condition := func() corev1.NodeCondition {
			t.Helper()
			n := e.node(t, "node-a")
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeNetworkUnavailable {
					return c
				}
			}
			t.Fatalf("node-a has no NetworkUnavailable condition: %+v", n.Status.Conditions)
			return corev1.NodeCondition{}
		}
		r, _ := e.registry(t, "node-a", e.netConf)
		if err := r.SetNetworkAvailable(ctx, ""); err != nil {
			t.Fatal(err)
		}
		weft := condition()
		if weft.Status != corev1.ConditionFalse || weft.Reason != "WeftIsUp" || weft.Message != "weft is running on this node" {
			t.Fatalf("NetworkUnavailable condition %+v, want False, WeftIsUp", weft)
		}
		rv := e.node(t, "node-a").ResourceVersion
		if err := r.SetNetworkAvailable(ctx, ""); err != nil {
			t.Fatalf("second SetNetworkAvailable: %v", err)
		}
		if got := e.node(t, "node-a").ResourceVersion; got != rv {
			t.Errorf("a second SetNetworkAvailable wrote the node (resourceVersion %s → %s)", rv, got)
		}
		// A dataplane in place of the configured one shows in the message.
		note := "uvxlan in place of vxlan: the kernel has no VXLAN driver"
		if err := r.SetNetworkAvailable(ctx, note); err != nil {
			t.Fatal(err)
		}
		if c := condition(); c.Message != "weft is running on this node ("+note+")" || c.Reason != "WeftIsUp" {
			t.Errorf("NetworkUnavailable condition with a note: %+v", c)
		}
		if err := r.SetNetworkAvailable(ctx, ""); err != nil {
			t.Fatal(err)
		}

		// Run as flanneld, the registry writes flanneld's reason and
		// message over weft's, and the condition keeps its transition time.
		time.Sleep(1100 * time.Millisecond) // transition times have a resolution of 1 s
		rf, _ := e.registryWith(t, kube.Options{NodeName: "node-a", ConfigFile: e.netConf, FlannelCondition: true})
		if err := rf.SetNetworkAvailable(ctx, ""); err != nil {
			t.Fatal(err)
		}
		fl := condition()
		if fl.Status != corev1.ConditionFalse || fl.Reason != "FlannelIsUp" || fl.Message != "Flannel is running on this node" {
			t.Fatalf("NetworkUnavailable condition %+v, want False, FlannelIsUp, as flanneld writes it", fl)
		}
		if !fl.LastTransitionTime.Equal(&weft.LastTransitionTime) {
			t.Errorf("transition time moved from %v to %v without a transition", weft.LastTransitionTime, fl.LastTransitionTime)
		}
	})

	t.Run("annotation prefix with a slash", func(t *testing.T) {
		const sp = "example.com/flannel-" // the keys flanneld makes from --kube-annotation-prefix=example.com/flannel
		e.createNode(t, "node-s", map[string]string{sp + "node-public-ip": "192.168.77.50"}, "10.244.201.0/24")
		r, _ := e.registryWith(t, kube.Options{NodeName: "node-s", ConfigFile: e.netConf, AnnotationPrefix: "example.com/flannel"})
		// node-public-ip is read before the lease, to choose the underlay.
		if v4, v6, err := r.NodePublicIPs(ctx); err != nil || v4 != netip.MustParseAddr("192.168.77.50") || v6.IsValid() {
			t.Errorf("NodePublicIPs = %s, %s, %v; want 192.168.77.50 from %snode-public-ip", v4, v6, err, sp)
		}
		l, err := r.Acquire(ctx, vxlanAttrs("192.168.77.5", 0x05))
		if err != nil {
			t.Fatal(err)
		}
		if l.Attrs.PublicIP != netip.MustParseAddr("192.168.77.50") {
			t.Errorf("lease public IP %s, want 192.168.77.50 from %snode-public-ip", l.Attrs.PublicIP, sp)
		}
		got := e.node(t, "node-s").Annotations
		for k, v := range map[string]string{
			sp + "backend-type":        "vxlan",
			sp + "backend-data":        `{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:05"}`,
			sp + "public-ip":           "192.168.77.50",
			sp + "kube-subnet-manager": "true",
		} {
			if got[k] != v {
				t.Errorf("annotation %s = %q, want %q", k, got[k], v)
			}
		}
		for k := range got {
			if strings.HasPrefix(k, prefix) {
				t.Errorf("annotation %s written under the default prefix", k)
			}
		}
		// A watch under that prefix sees this node, and only it.
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		ch := make(chan []subnet.Event, 4)
		go r.Watch(wctx, ch)
		select {
		case b := <-ch:
			if len(b) != 1 || b[0].Lease.Subnet != netip.MustParsePrefix("10.244.201.0/24") ||
				b[0].Lease.Attrs.PublicIP != netip.MustParseAddr("192.168.77.50") {
				t.Fatalf("watch under %s: %+v, want node-s alone", sp, b)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no watch event for node-s")
		}
	})

	t.Run("watch", func(t *testing.T) { testWatch(ctx, t, e) })
}
