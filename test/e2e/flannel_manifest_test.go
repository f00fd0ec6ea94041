package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
)

// TestFlannelLayoutManifest applies kube-manifests/flannel-compat (Flannel's
// layout and commands, weft's image) to a real kube-apiserver with strict
// validation, then runs weftd installed as /opt/bin/flanneld on two node
// namespaces with exactly the DaemonSet's arguments and environment (as its
// ServiceAccount; the node name comes from the pod, as Flannel's does), and
// wires pods with the weft plugin installed as "flannel" from the
// ConfigMap's Flannel-format conflist.
func TestFlannelLayoutManifest(t *testing.T) {
	k := kubetest.Start(t)
	k.StartControllerManager(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	objs := applyStrict(ctx, t, k, filepath.Join(ModuleRootDir(t), "kube-manifests", "flannel-compat", "kube-flannel.yml"))
	var ds appsv1.DaemonSet
	var cm corev1.ConfigMap
	fromObjs(t, objs, "DaemonSet", &ds)
	fromObjs(t, objs, "ConfigMap", &cm)
	main := ds.Spec.Template.Spec.Containers[0]
	if !reflect.DeepEqual(main.Command, []string{"/opt/bin/flanneld"}) ||
		!reflect.DeepEqual(main.Args, []string{"--ip-masq", "--kube-subnet-mgr", "--healthz-port=8081"}) {
		t.Fatalf("DaemonSet runs %v %v, not Flannel's command line", main.Command, main.Args)
	}
	dir := t.TempDir()
	netConf := filepath.Join(dir, "net-conf.json")
	if err := os.WriteFile(netConf, []byte(cm.Data["net-conf.json"]), 0o644); err != nil {
		t.Fatal(err)
	}
	kubeconfig := saKubeconfig(ctx, t, k, "kube-flannel", "flannel")
	flanneld := filepath.Join(dir, "opt", "bin", "flanneld")
	cniBin := filepath.Join(dir, "opt", "cni", "bin")
	os.MkdirAll(filepath.Dir(flanneld), 0o755)
	os.MkdirAll(cniBin, 0o755)
	if err := os.Symlink(Binary(t), flanneld); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(nettest.Binary(t, "weft"), filepath.Join(cniBin, "flannel")); err != nil {
		t.Fatal(err)
	}

	c := NewCluster(t, Options{Nodes: 0})
	apiserver := strings.TrimPrefix(k.Admin.Host, "https://")
	c.OnNode = func(n *Node) {
		nettest.ForwardLoopback(t, n, apiserver)
		n.Prog = flanneld
		n.Env = []string{"POD_NAME=kube-flannel-ds-" + n.Label, "POD_NAMESPACE=kube-flannel", "NODE_NAME="}
	}
	// The DaemonSet's arguments, then what a pod gets from its mounts and
	// service account (a kubeconfig here, the ConfigMap's net-conf.json),
	// and the health address the harness polls instead of :8081.
	args := append(append([]string{}, main.Args...), "--kubeconfig-file", kubeconfig, "--net-config-path", netConf,
		"--healthz-ip=127.0.0.1", "--healthz-port=9470")
	var nodes []*Node
	for _, name := range []string{"n1", "n2"} {
		createNode(ctx, t, k, name)
		createPodOn(ctx, t, k, "kube-flannel", "kube-flannel-ds-"+name, name)
		nodes = append(nodes, c.AddNode(name, args...))
	}
	var pods []*plugintest.Pod
	for _, n := range nodes {
		n.WaitReady()
		node, err := k.Client.CoreV1().Nodes().Get(ctx, n.Label, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Subnet().String() != node.Spec.PodCIDR {
			t.Errorf("%s: subnet %s, podCIDR %s", n.Label, n.Subnet(), node.Spec.PodCIDR)
		}
		ready := false
		for _, cond := range node.Status.Conditions {
			ready = ready || cond.Type == corev1.NodeNetworkUnavailable && cond.Status == corev1.ConditionFalse
		}
		if !ready {
			t.Errorf("%s: no NetworkUnavailable=False", n.Label)
		}
		if log, _ := os.ReadFile(n.LogFile); !strings.Contains(string(log), "flannelCompat=true") || !strings.Contains(string(log), "node name from this pod") {
			t.Errorf("%s: weftd did not run as flanneld with the pod's node name:\n%s", n.Label, tail(string(log), 20))
		}
		pods = append(pods, flannelCNI(t, n, cm.Data["cni-conf.json"], cniBin).AddPod(t, n.Label+"-pod"))
	}
	Eventually(t, 5*time.Second, "pod on n1 → pod on n2", func() error { return Ping(pods[0].NS, pods[1].IP, "-W", "1") })
	if err := Ping(pods[1].NS, pods[0].IP); err != nil {
		t.Errorf("pod on n2 → pod on n1: %v", err)
	}
}

// flannelCNI runs the ConfigMap's Flannel conflist on n, with the plugin
// installed as "flannel". Only the node's subnet file and data directories
// (dataDir, and ipam.dataDir for the address store) are added to the
// flannel entry: the test's nodes share one file system.
func flannelCNI(t *testing.T, n *Node, conflist, cniBin string) *plugintest.Node {
	t.Helper()
	var list map[string]any
	if err := json.Unmarshal([]byte(conflist), &list); err != nil {
		t.Fatal(err)
	}
	fl := list["plugins"].([]any)[0].(map[string]any)
	if fl["type"] != "flannel" || fl["delegate"] == nil {
		t.Fatalf("not Flannel's conflist entry: %v", fl)
	}
	dir := t.TempDir()
	fl["subnetFile"], fl["dataDir"], fl["ipam"] = n.SubnetFile, dir, map[string]any{"dataDir": dir}
	b, _ := json.Marshal(list)
	l, err := libcni.NetworkConfFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{cniBin, nettest.ReferencePlugins(t)}, t.TempDir(),
		&plugintest.NSExec{RawExec: invoke.RawExec{Stderr: os.Stderr}, NS: n.NS})
	return &plugintest.Node{NS: n.NS, CNI: cni, List: l}
}

// createPodOn creates the DaemonSet's pod bound to node, as the DaemonSet
// controller would (this cluster runs no kubelet and no DaemonSet
// controller).
func createPodOn(ctx context.Context, t *testing.T, k *kubetest.Cluster, ns, name, node string) {
	t.Helper()
	no := false
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "flannel", AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "kube-flannel", Image: "ghcr.io/weft-net/weft:latest"}}}}
	if _, err := k.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
}

// applyStrict creates every object of the manifest file with strict field
// validation and returns them.
func applyStrict(ctx context.Context, t *testing.T, k *kubetest.Cluster, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dyn, err := dynamic.NewForConfig(k.Admin)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(k.Client.Discovery())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if len(m) == 0 {
			continue
		}
		o := &unstructured.Unstructured{Object: m}
		gvk := o.GroupVersionKind()
		rm, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatal(err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(rm.Resource)
		if o.GetNamespace() != "" {
			ri = dyn.Resource(rm.Resource).Namespace(o.GetNamespace())
		}
		if _, err := ri.Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("create %s %s: %v", gvk.Kind, o.GetName(), err)
		}
		objs = append(objs, o)
	}
	return objs
}

func fromObjs(t *testing.T, objs []*unstructured.Unstructured, kind string, into any) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no %s in the manifest", kind)
}

// saKubeconfig writes a kubeconfig that authenticates as a ServiceAccount.
func saKubeconfig(ctx context.Context, t *testing.T, k *kubetest.Cluster, ns, name string) string {
	t.Helper()
	cfg, err := k.ServiceAccountConfig(ctx, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["k"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: "k", AuthInfo: name}
	kc.CurrentContext = name
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}
