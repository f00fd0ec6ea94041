// Package kube tests kube-manifests/ against a real API server: the objects
// are accepted with strict field validation, and the ServiceAccount they
// create can do what weftd does and nothing more.
package kube

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/subnet"
	kubereg "github.com/weft-net/weft/subnet/kube"
)

const manifestPath = "../../kube-manifests/kube-weft.yml"

// readManifests decodes every document of the manifest file.
func readManifests(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode %s: %v", manifestPath, err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

// apply creates every object with strict field validation, so unknown or
// duplicated fields fail as they would with kubectl.
func apply(ctx context.Context, t *testing.T, c *kubetest.Cluster, objs []*unstructured.Unstructured) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(c.Admin)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(c.Client.Discovery())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk.Kind, o.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if o.GetNamespace() != "" {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		if _, err := ri.Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("create %s %s: %v", gvk.Kind, o.GetName(), err)
		}
	}
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind string, into any) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no %s in %s", kind, manifestPath)
}

// TestManifestContents checks the parts of the manifests that weftd and
// the runtime depend on.
func TestManifestContents(t *testing.T) {
	objs := readManifests(t)
	var cm corev1.ConfigMap
	find(t, objs, "ConfigMap", &cm)
	cfg, err := subnet.ParseConfig([]byte(cm.Data["net-conf.json"]))
	if err != nil {
		t.Fatalf("net-conf.json: %v", err)
	}
	if cfg.Network.String() != kubetest.ClusterCIDR {
		t.Errorf("net-conf.json Network %s, want %s (the usual --cluster-cidr)", cfg.Network, kubetest.ClusterCIDR)
	}
	var got, want any
	if err := json.Unmarshal([]byte(cm.Data["cni-conf.json"]), &got); err != nil {
		t.Fatalf("cni-conf.json: %v", err)
	}
	_ = json.Unmarshal([]byte(`{"cniVersion":"1.0.0","cniVersions":["1.0.0","1.1.0"],"name":"weft","plugins":[{"type":"weft"},{"type":"portmap","capabilities":{"portMappings":true}}]}`), &want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("cni-conf.json = %s", cm.Data["cni-conf.json"])
	}

	var ds appsv1.DaemonSet
	find(t, objs, "DaemonSet", &ds)
	spec := ds.Spec.Template.Spec
	checks := []struct {
		name string
		ok   bool
	}{
		{"hostNetwork", spec.HostNetwork},
		{"priorityClassName system-node-critical", spec.PriorityClassName == "system-node-critical"},
		{"service account weft", spec.ServiceAccountName == "weft"},
		{"tolerates every NoSchedule taint", len(spec.Tolerations) > 0 && spec.Tolerations[0].Operator == corev1.TolerationOpExists && spec.Tolerations[0].Key == "" && spec.Tolerations[0].Effect == corev1.TaintEffectNoSchedule},
		{"two init containers", len(spec.InitContainers) == 2},
		{"one container", len(spec.Containers) == 1},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("DaemonSet: not %s", c.name)
		}
	}
	if t.Failed() {
		return
	}
	for _, ic := range spec.InitContainers {
		cmd := strings.Join(ic.Args, " ")
		if !strings.Contains(cmd, " cp ") || !strings.Contains(cmd, " mv -f ") {
			t.Errorf("init container %s does not copy then rename: %s", ic.Name, cmd)
		}
	}
	w := spec.Containers[0]
	if !reflect.DeepEqual(w.Args, []string{"--kube-subnet-mgr", "--health-addr=127.0.0.1:9470"}) {
		t.Errorf("weftd args %v", w.Args)
	}
	if len(w.Env) == 0 || w.Env[0].Name != "NODE_NAME" || w.Env[0].ValueFrom == nil || w.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("weftd env %+v: want NODE_NAME from spec.nodeName", w.Env)
	}
	// BPF because a vxlan node falls back to uvxlan, whose fast path is on
	// unless the config turns it off.
	sc := w.SecurityContext
	if !cfg.Backend.FastPath || (cfg.Backend.Type != subnet.BackendTypeVXLAN && cfg.Backend.Type != subnet.BackendTypeUVXLAN) {
		t.Errorf("net-conf.json backend %s, fast path %v: the test expects vxlan with uvxlan's fast path", cfg.Backend.Type, cfg.Backend.FastPath)
	}
	if sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.Capabilities == nil ||
		!reflect.DeepEqual(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN", "NET_RAW", "BPF"}) {
		t.Errorf("weftd securityContext %+v: want NET_ADMIN, NET_RAW and BPF (uvxlan's fast path), not privileged", sc)
	}
	for name, p := range map[string]*corev1.Probe{"/healthz": w.LivenessProbe, "/readyz": w.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != name || p.HTTPGet.Host != "127.0.0.1" || p.HTTPGet.Port.IntValue() != 9470 {
			t.Errorf("probe %s: %+v", name, p)
		}
	}
	mounts := map[string]bool{}
	for _, m := range w.VolumeMounts {
		mounts[m.MountPath] = true
	}
	for _, p := range []string{"/run/flannel", "/etc/cni/net.d", "/opt/cni/bin", "/var/lib/cni", "/dev/net/tun", "/etc/kube-flannel/"} {
		if !mounts[p] {
			t.Errorf("weftd does not mount %s", p)
		}
	}
	if w.Resources.Requests.Cpu().IsZero() || w.Resources.Requests.Memory().IsZero() {
		t.Errorf("weftd has no resource requests")
	}
}

// TestManifestsOnAPIServer applies the manifests, then acts as weftd with
// the token of their ServiceAccount.
func TestManifestsOnAPIServer(t *testing.T) {
	c := kubetest.Start(t)
	c.StartControllerManager(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	objs := readManifests(t)
	apply(ctx, t, c, objs)

	saCfg, err := c.ServiceAccountConfig(ctx, "kube-weft", "weft")
	if err != nil {
		t.Fatal(err)
	}
	sa, err := kubernetes.NewForConfig(saCfg)
	if err != nil {
		t.Fatal(err)
	}
	saNodes, err := kubereg.NewClientForConfig(saCfg) // weftd's own Node client
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"node-1", "node-2"} {
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var cm corev1.ConfigMap
	find(t, objs, "ConfigMap", &cm)
	netConf := filepath.Join(t.TempDir(), "net-conf.json")
	if err := os.WriteFile(netConf, []byte(cm.Data["net-conf.json"]), 0o644); err != nil {
		t.Fatal(err)
	}

	// What weftd does, as the ServiceAccount: get its node and patch its
	// status (Acquire), list and watch nodes (Watch), set the condition.
	regs := map[string]*kubereg.Registry{}
	for i, name := range []string{"node-1", "node-2"} {
		r, err := kubereg.New(saNodes, kubereg.Options{NodeName: name, ConfigFile: netConf, PodCIDRPoll: 50 * time.Millisecond}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		regs[name] = r
		attrs := subnet.LeaseAttrs{PublicIP: netip.AddrFrom4([4]byte{192, 168, 77, byte(i + 1)}), BackendType: subnet.BackendTypeVXLAN,
			BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: subnet.MAC{0x4e, 0, 0, 0, 0, byte(i + 1)}}}
		if _, err := r.Acquire(ctx, attrs, netip.Prefix{}); err != nil {
			t.Fatalf("Acquire as the ServiceAccount: %v", err)
		}
		if err := r.SetNetworkAvailable(ctx, ""); err != nil {
			t.Fatalf("SetNetworkAvailable as the ServiceAccount: %v", err)
		}
	}
	wctx, stop := context.WithCancel(ctx)
	events := make(chan []subnet.Event, 4)
	werr := make(chan error, 1)
	go func() { werr <- regs["node-1"].Watch(wctx, events) }()
	select {
	case b := <-events:
		if len(b) != 2 {
			t.Errorf("Watch as the ServiceAccount: initial batch %+v, want both nodes", b)
		}
	case err := <-werr:
		t.Fatalf("Watch as the ServiceAccount: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Watch as the ServiceAccount: no initial batch")
	}
	stop()
	<-werr

	// Everything else is refused.
	label, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{"x": "y"}}})
	forbidden := []struct {
		name string
		do   func() error
	}{
		{"delete nodes", func() error { return sa.CoreV1().Nodes().Delete(ctx, "node-2", metav1.DeleteOptions{}) }},
		{"create nodes", func() error {
			_, err := sa.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rogue"}}, metav1.CreateOptions{})
			return err
		}},
		{"patch nodes (not status)", func() error {
			_, err := sa.CoreV1().Nodes().Patch(ctx, "node-1", types.StrategicMergePatchType, label, metav1.PatchOptions{})
			return err
		}},
		{"update nodes/status", func() error {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
			if err != nil {
				return err
			}
			_, err = sa.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
			return err
		}},
		{"list secrets", func() error { _, err := sa.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{}); return err }},
		{"get pods", func() error { _, err := sa.CoreV1().Pods("kube-weft").Get(ctx, "any", metav1.GetOptions{}); return err }},
		// --network-policy lists and watches pods, namespaces and
		// networkpolicies; it changes none of them.
		{"delete pods", func() error { return sa.CoreV1().Pods("kube-weft").Delete(ctx, "any", metav1.DeleteOptions{}) }},
		{"delete networkpolicies", func() error {
			return sa.NetworkingV1().NetworkPolicies("kube-weft").Delete(ctx, "any", metav1.DeleteOptions{})
		}},
		{"list configmaps", func() error {
			_, err := sa.CoreV1().ConfigMaps("kube-weft").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"get daemonsets", func() error {
			_, err := sa.AppsV1().DaemonSets("kube-weft").Get(ctx, "weft", metav1.GetOptions{})
			return err
		}},
	}
	for _, f := range forbidden {
		t.Run(f.name, func(t *testing.T) {
			if err := f.do(); !apierrors.IsForbidden(err) {
				t.Errorf("%s as the ServiceAccount: %v, want Forbidden", f.name, err)
			}
		})
	}
	if _, err := c.Client.CoreV1().Nodes().Get(ctx, "node-2", metav1.GetOptions{}); err != nil {
		t.Errorf("node-2 after the refused delete: %v", err)
	}
}
