package kube

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func TestTrimNode(t *testing.T) {
	a, err := newAnnotations("flannel.alpha.coreos.com")
	if err != nil {
		t.Fatal(err)
	}
	full := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: "n1", ResourceVersion: "42", UID: "u-1", Labels: map[string]string{"a": "b"},
			Annotations: map[string]string{
				"flannel.alpha.coreos.com/backend-type": "vxlan",
				"flannel.alpha.coreos.com/public-ip":    "192.0.2.1",
				"flannel.alpha.coreos.com.evil/x":       "no",
				"node.alpha.kubernetes.io/ttl":          "0",
			},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
		},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:1::/64"}, ProviderID: "p"},
		Status: corev1.NodeStatus{
			Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
			Images:   []corev1.ContainerImage{{Names: []string{"img"}, SizeBytes: 1}},
		},
	}
	want := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: "n1", ResourceVersion: "42",
			Annotations: map[string]string{
				"flannel.alpha.coreos.com/backend-type": "vxlan",
				"flannel.alpha.coreos.com/public-ip":    "192.0.2.1",
			},
		},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:1::/64"}},
	}
	got, err := a.trimNode(full)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("trimNode:\n got %+v\nwant %+v", got, want)
	}
	got.(*corev1.Node).Spec.PodCIDRs[0] = "changed"
	if full.Spec.PodCIDRs[0] != "10.244.1.0/24" {
		t.Error("trimNode shares the podCIDRs slice with its input")
	}
	bare, _ := a.trimNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}})
	if bare.(*corev1.Node).Annotations != nil || bare.(*corev1.Node).Spec.PodCIDRs != nil {
		t.Errorf("trimNode of a bare node: %+v", bare)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "n1", Obj: want}
	if got, _ := a.trimNode(tomb); !reflect.DeepEqual(got, tomb) {
		t.Errorf("trimNode changed a tombstone: %+v", got)
	}
}
