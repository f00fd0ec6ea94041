package kuberest_test

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/weft-net/weft/internal/ops/kuberest"
	"github.com/weft-net/weft/internal/testkit/kubetest"
)

// TestClient reads core/v1 and apps/v1 objects from a real API server
// with clients whose scheme knows only those groups, and lists with a
// label selector through the scheme's parameter codec.
func TestClient(t *testing.T) {
	k := kubetest.Start(t)
	ctx := context.Background()
	scheme, err := kuberest.Scheme(corev1.AddToScheme, appsv1.AddToScheme)
	if err != nil {
		t.Fatal(err)
	}
	core, err := kuberest.Client(k.Admin, scheme, "/api", corev1.SchemeGroupVersion)
	if err != nil {
		t.Fatal(err)
	}
	var ns corev1.Namespace
	if err := core.Get().Resource("namespaces").Name("default").Do(ctx).Into(&ns); err != nil {
		t.Fatalf("get namespace default: %v", err)
	}
	if ns.Name != "default" {
		t.Fatalf("namespace %q, want default", ns.Name)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kuberest", Labels: map[string]string{"app": "kuberest"}}}
	if err := core.Post().Namespace("default").Resource("configmaps").Body(cm).Do(ctx).Error(); err != nil {
		t.Fatalf("create configmap: %v", err)
	}
	var cms corev1.ConfigMapList
	opts := metav1.ListOptions{LabelSelector: "app=kuberest"}
	if err := core.Get().Namespace("default").Resource("configmaps").VersionedParams(&opts, runtime.NewParameterCodec(scheme)).Do(ctx).Into(&cms); err != nil {
		t.Fatalf("list configmaps: %v", err)
	}
	if len(cms.Items) != 1 || cms.Items[0].Name != "kuberest" {
		t.Fatalf("configmaps app=kuberest: %+v, want only kuberest", cms.Items)
	}
	apps, err := kuberest.Client(k.Admin, scheme, "/apis", appsv1.SchemeGroupVersion)
	if err != nil {
		t.Fatal(err)
	}
	var dss appsv1.DaemonSetList
	if err := apps.Get().Namespace("default").Resource("daemonsets").Do(ctx).Into(&dss); err != nil {
		t.Fatalf("list daemonsets: %v", err)
	}
}
