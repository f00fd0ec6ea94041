package helm

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/subnet"
)

// TestOnAPIServer runs against a real kube-apiserver on 127.0.0.1: the
// rendered objects of several value sets pass strict server-side field
// validation, then helm installs the chart, upgrades it with changed
// values, refuses a bad upgrade without touching the release, rolls back
// and uninstalls.
//
// The chart has had one version so far (0.1.0), so "upgrade" here is an
// upgrade of a release of this version to new values through helm; when a
// later version exists, install the previous one (from git) first.
func TestOnAPIServer(t *testing.T) {
	h := newHelm(t)
	k := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The namespace as the README has users create it: Pod Security
	// "privileged", since weftd runs on the host network with hostPath
	// volumes and NET_ADMIN.
	if _, err := k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: "kube-weft", Labels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("strict validation", func(t *testing.T) {
		for name, values := range map[string]string{
			"defaults":             "",
			"wireguard dual-stack": wireguardDualStack,
			"every DaemonSet value": `
global: {imagePullSecrets: [{name: regcred}]}
flannel:
  image: {repository: registry.example/weft, tag: v9}
  cniBinDir: /usr/libexec/cni
  tolerations: [{operator: Exists}]
  nodeSelector: {weft: "yes"}
  resources: {requests: {cpu: 50m}, limits: {memory: 200Mi}}
  healthz: {port: 9999, livenessProbe: {timeoutSeconds: 2, successThreshold: 1}}
`,
			"no health server, no conflist": "flannel: {healthz: {port: 0}, skipCNIConfigInstallation: true}\n",
		} {
			t.Run(name, func(t *testing.T) { dryRunStrict(ctx, t, k, h.template(t, values)) })
		}
	})

	kubeconfig := k.Kubeconfig()
	release := func(args ...string) []string {
		return append(append([]string{}, args...), "--namespace", "kube-weft", "--kubeconfig", kubeconfig)
	}
	ds := func() *appsv1.DaemonSet {
		t.Helper()
		d, err := k.Client.AppsV1().DaemonSets("kube-weft").Get(ctx, "weft", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	backend := func() string {
		t.Helper()
		cm, err := k.Client.CoreV1().ConfigMaps("kube-weft").Get(ctx, "weft-cfg", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := subnet.ParseConfig([]byte(cm.Data["net-conf.json"]))
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Backend.Type
	}
	revision := func() int {
		t.Helper()
		var st struct {
			Version int
			Info    struct{ Status string }
		}
		out := h.mustRun(t, release("status", "weft", "--output", "json")...)
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("helm status: %v\n%s", err, out)
		}
		if st.Info.Status != "deployed" {
			t.Fatalf("release status %q, want deployed", st.Info.Status)
		}
		return st.Version
	}

	h.mustRun(t, release("install", "weft", chartDir(t))...)
	first := ds()
	if img := first.Spec.Template.Spec.Containers[0].Image; img != "ghcr.io/weft-net/weft:latest" || backend() != "vxlan" || revision() != 1 {
		t.Fatalf("after install: image %s, backend %s, revision %d", img, backend(), revision())
	}
	if _, err := k.Client.RbacV1().ClusterRoleBindings().Get(ctx, "weft", metav1.GetOptions{}); err != nil {
		t.Fatalf("after install: %v", err)
	}

	h.mustRun(t, release("upgrade", "weft", chartDir(t), "--set", "flannel.backend=host-gw",
		"--set", "flannel.image.tag=v2", "--set", "flannel.healthz.port=9471")...)
	up := ds()
	w := up.Spec.Template.Spec.Containers[0]
	switch {
	case up.UID != first.UID:
		t.Errorf("upgrade replaced the DaemonSet (uid %s, was %s) instead of updating it", up.UID, first.UID)
	case up.Generation <= first.Generation:
		t.Errorf("upgrade left the DaemonSet's generation at %d", up.Generation)
	case w.Image != "ghcr.io/weft-net/weft:v2" || !slices.Contains(w.Args, "--health-addr=127.0.0.1:9471") ||
		w.LivenessProbe.HTTPGet.Port.IntValue() != 9471:
		t.Errorf("after upgrade: weftd %s %q, liveness port %s", w.Image, w.Args, w.LivenessProbe.HTTPGet.Port.String())
	case backend() != "host-gw":
		t.Errorf("after upgrade: backend %s, want host-gw", backend())
	case revision() != 2:
		t.Errorf("after upgrade: revision %d, want 2", revision())
	}

	// A refused value fails the upgrade before anything is sent.
	if out, err := h.run(release("upgrade", "weft", chartDir(t), "--set", "flannel.backend=udp")...); err == nil ||
		!strings.Contains(err.Error(), "use uvxlan") {
		t.Errorf("upgrade to backend udp: %v\n%s", err, out)
	}
	if backend() != "host-gw" || revision() != 2 || ds().Generation != up.Generation {
		t.Errorf("the refused upgrade changed the release: backend %s, revision %d", backend(), revision())
	}

	h.mustRun(t, release("rollback", "weft", "1")...)
	if img := ds().Spec.Template.Spec.Containers[0].Image; img != "ghcr.io/weft-net/weft:latest" || backend() != "vxlan" || revision() != 3 {
		t.Errorf("after rollback to 1: image %s, backend %s, revision %d", img, backend(), revision())
	}

	h.mustRun(t, release("uninstall", "weft")...)
	gone := map[string]error{}
	_, gone["DaemonSet weft"] = k.Client.AppsV1().DaemonSets("kube-weft").Get(ctx, "weft", metav1.GetOptions{})
	_, gone["ConfigMap weft-cfg"] = k.Client.CoreV1().ConfigMaps("kube-weft").Get(ctx, "weft-cfg", metav1.GetOptions{})
	_, gone["ServiceAccount weft"] = k.Client.CoreV1().ServiceAccounts("kube-weft").Get(ctx, "weft", metav1.GetOptions{})
	_, gone["ClusterRole weft"] = k.Client.RbacV1().ClusterRoles().Get(ctx, "weft", metav1.GetOptions{})
	_, gone["ClusterRoleBinding weft"] = k.Client.RbacV1().ClusterRoleBindings().Get(ctx, "weft", metav1.GetOptions{})
	for obj, err := range gone {
		if !apierrors.IsNotFound(err) {
			t.Errorf("after uninstall, %s: %v (want NotFound)", obj, err)
		}
	}
}

// dryRunStrict creates every object as a server-side dry run with strict
// field validation: the API server checks each object completely (unknown
// or duplicated fields, types, defaults, admission) and stores nothing.
func dryRunStrict(ctx context.Context, t *testing.T, k *kubetest.Cluster, objs []*unstructured.Unstructured) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(k.Admin)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(k.Client.Discovery())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	if len(objs) == 0 {
		t.Fatal("no objects")
	}
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
		if _, err := ri.Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict", DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("create %s %s (dry run, strict): %v", gvk.Kind, o.GetName(), err)
		}
	}
}
