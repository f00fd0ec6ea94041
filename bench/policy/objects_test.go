package policy

// The API objects of the benchmark's conditions: the allowing policy, and
// the 1,000 other Pods and policies (API objects only), as policy's
// TestScale makes them.

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// otherNamespaces are the namespaces of the other Pods and policies.
func otherNamespaces() []string {
	var out []string
	for i := range 10 {
		out = append(out, fmt.Sprintf("ns%d", i))
	}
	return out
}

// otherPod is the i-th other Pod: on n2, an address of n2's podCIDR above
// the ones the CNI plugin gives (from 10.244.4.16), labels as in policy's
// TestScale. Only its API object exists: no namespace, no interface.
func otherPod(i int) (*corev1.Pod, netip.Addr) {
	a := netip.MustParseAddr("10.244.4.16")
	for range i {
		a = a.Next()
	}
	return podObject(fmt.Sprintf("ns%d", i%10), fmt.Sprintf("p%d", i), "n2",
		map[string]string{"app": fmt.Sprintf("app%d", i/10), "role": fmt.Sprintf("r%d", i%100)}), a
}

// otherPolicy is the i-th other policy, as in policy's TestScale: in
// namespace ns(i%10), it selects the pods labelled app(i%100) and allows
// ingress from the pods labelled role(i%100) of every namespace, on TCP
// 80 and the named port web. None selects the server or the client.
func otherPolicy(i int) *networkingv1.NetworkPolicy {
	web, http := intstr.FromString("web"), intstr.FromInt32(80)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%10), Name: fmt.Sprintf("np%d", i)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", i%100)}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{},
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprintf("r%d", i%100)}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &http}, {Port: &web}},
			}},
		}}
}

// allowPolicy selects the server and allows the client on the two ports
// the benchmark uses.
func allowPolicy() *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	p1, p2 := intstr.FromInt32(connPort), intstr.FromInt32(iperfPort)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: benchNS, Name: "allow-client"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p1}, {Protocol: &tcp, Port: &p2}},
			}},
		}}
}

func podObject(ns, name, node string, labels map[string]string) *corev1.Pod {
	no := false
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "pods", AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "srv", Image: "srv",
				Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}}}
}
