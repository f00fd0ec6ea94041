package policy

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func r(a, b string) Range { return Range{ip(a), ip(b)} }

func TestIPBlockExcept(t *testing.T) {
	for _, tc := range []struct {
		cidr   string
		except []string
		want   []Range
	}{
		{"10.0.0.0/8", nil, []Range{r("10.0.0.0", "10.255.255.255")}},
		{"10.0.0.0/8", []string{"10.1.0.0/16"}, []Range{r("10.0.0.0", "10.0.255.255"), r("10.2.0.0", "10.255.255.255")}},
		{"10.0.0.0/8", []string{"10.0.0.0/9", "10.255.255.255/32"}, []Range{r("10.128.0.0", "10.255.255.254")}},
		{"0.0.0.0/0", []string{"0.0.0.0/1"}, []Range{r("128.0.0.0", "255.255.255.255")}},
		{"10.0.0.0/8", []string{"10.0.0.0/8"}, nil},
		{"fd00::/8", nil, nil},
	} {
		t.Run(fmt.Sprint(tc.cidr, tc.except), func(t *testing.T) {
			got, err := ipBlock(&networkingv1.IPBlock{CIDR: tc.cidr, Except: tc.except})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := ipBlock(&networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"fd00::/8"}}); err == nil {
		t.Error("an IPv6 exception of an IPv4 block: no error")
	}
}

func TestMerge(t *testing.T) {
	got := merge([]Range{r("10.0.0.5", "10.0.0.9"), r("10.0.0.1", "10.0.0.4"), r("10.0.0.7", "10.0.0.20"),
		r("10.0.1.0", "10.0.1.0"), r("200.0.0.0", "255.255.255.255"), r("250.0.0.0", "250.0.0.1")})
	want := []Range{r("10.0.0.1", "10.0.0.20"), r("10.0.1.0", "10.0.1.0"), r("200.0.0.0", "255.255.255.255")}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func testPod(ns, name, addr string, web int32) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"pod": name}},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: web}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: addr}}
}

// TestNamedPortPerPod: a named port means each pod's own number, the
// destination's: the local pod's for ingress, the peer's for egress.
func TestNamedPortPerPod(t *testing.T) {
	web := intstr.FromString("web")
	in := Input{Local: netip.MustParsePrefix("10.244.1.0/24"),
		Pods: []*corev1.Pod{testPod("x", "a", "10.244.1.2", 80), testPod("x", "b", "10.244.1.3", 8080), testPod("x", "c", "10.244.2.2", 9090)},
		Policies: []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "p"},
			Spec: networkingv1.NetworkPolicySpec{
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &web}}}},
				Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &web}},
					To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "c"}}}}}},
			}}},
	}
	plan := Compute(in)
	if len(plan.Errors) > 0 {
		t.Fatal(plan.Errors)
	}
	local := []netip.Addr{ip("10.244.1.2"), ip("10.244.1.3")}
	if !reflect.DeepEqual(plan.IngressIsolated, local) || !reflect.DeepEqual(plan.EgressIsolated, local) {
		t.Errorf("isolated: %v %v", plan.IngressIsolated, plan.EgressIsolated)
	}
	if len(plan.Rules) != 2 {
		t.Fatalf("rules: %+v", plan.Rules)
	}
	wantIn := []PortEntry{{r("10.244.1.2", "10.244.1.2"), protoTCP, 80, 80}, {r("10.244.1.3", "10.244.1.3"), protoTCP, 8080, 8080}}
	if got := plan.Rules[0]; got.Egress || !got.AnyPeer || !reflect.DeepEqual(got.Ports, wantIn) {
		t.Errorf("ingress rule %+v, want ports %v", got, wantIn)
	}
	wantEg := []PortEntry{{r("10.244.2.2", "10.244.2.2"), protoTCP, 9090, 9090}}
	if got := plan.Rules[1]; !got.Egress || !reflect.DeepEqual(got.NamedPorts, wantEg) || len(got.Ports) != 0 {
		t.Errorf("egress rule %+v, want named ports %v", got, wantEg)
	}
}

// TestBadPolicyIsolates: a policy that cannot be read isolates its pods
// with none of its rules, and is reported.
func TestBadPolicyIsolates(t *testing.T) {
	bad := intstr.FromInt32(0)
	in := Input{Local: netip.MustParsePrefix("10.244.1.0/24"), Pods: []*corev1.Pod{testPod("x", "a", "10.244.1.2", 80)},
		Policies: []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "p"},
			Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &bad}}}}}}}}
	plan := Compute(in)
	if len(plan.Errors) != 1 || len(plan.Rules) != 0 || !reflect.DeepEqual(plan.IngressIsolated, []netip.Addr{ip("10.244.1.2")}) {
		t.Errorf("plan %+v", plan)
	}
}
