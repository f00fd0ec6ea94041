package kube

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// trimNode is the informer's transform: it replaces a Node with a copy that
// holds only what the registry reads (the name, the resource version the
// informer resumes from, the podCIDRs and the annotations under weft's
// prefix). Anything else passes unchanged (the informer may hand over a
// cache.DeletedFinalStateUnknown, whose object was trimmed already).
func (a annotations) trimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	t := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:            n.Name,
			ResourceVersion: n.ResourceVersion,
		},
		Spec: corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR},
	}
	if len(n.Spec.PodCIDRs) > 0 {
		t.Spec.PodCIDRs = append([]string(nil), n.Spec.PodCIDRs...)
	}
	for k, v := range n.Annotations {
		if !strings.HasPrefix(k, a.prefix) {
			continue
		}
		if t.Annotations == nil {
			t.Annotations = make(map[string]string, 8)
		}
		t.Annotations[k] = v
	}
	return t, nil
}
