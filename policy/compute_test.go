package policy

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

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
			got, err := ipBlock(&networkingv1.IPBlock{CIDR: tc.cidr, Except: tc.except}, true)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := ipBlock(&networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"fd00::/8"}}, true); err == nil {
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

// TestBadPodSelectorIsolatesNamespace: a policy whose podSelector cannot
// be read (an operator the API should have refused) isolated nothing; it
// isolates every pod of its namespace (ingress and egress, as its types
// say), with none of its rules, and no pod of another namespace.
func TestBadPodSelectorIsolatesNamespace(t *testing.T) {
	in := Input{Local: netip.MustParsePrefix("10.244.1.0/24"),
		Pods: []*corev1.Pod{testPod("x", "a", "10.244.1.2", 80), testPod("x", "b", "10.244.1.3", 80), testPod("y", "c", "10.244.1.4", 80)},
		Policies: []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "p"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{}},
			}}}}
	plan := Compute(in)
	want := []netip.Addr{ip("10.244.1.2"), ip("10.244.1.3")}
	if len(plan.Errors) != 1 || len(plan.Rules) != 0 || !reflect.DeepEqual(plan.IngressIsolated, want) || !reflect.DeepEqual(plan.EgressIsolated, want) {
		t.Errorf("plan %+v, want namespace x's pods %v isolated both ways with no rules and one error", plan, want)
	}
}

// TestStalePodLendsNoLabels: the peers of "allow from role=trusted" are
// decided by the pod that holds an address now. A finished pod (Succeeded
// or Failed) whose status still lists an address, and an older pod that
// still lists an address a newer pod was given, are not that address's
// identity, whatever the order of the list.
func TestStalePodLendsNoLabels(t *testing.T) {
	at := func(s int) metav1.Time { return metav1.NewTime(time.Unix(1_800_000_000+int64(s), 0)) }
	pod := func(name, addr string, trusted bool, phase corev1.PodPhase, created int) *corev1.Pod {
		p := testPod("x", name, addr, 80)
		if trusted {
			p.Labels["role"] = "trusted"
		}
		p.Status.Phase, p.CreationTimestamp = phase, at(created)
		return p
	}
	policy := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "p"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "server"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "trusted"}}}}}}}}
	server := pod("server", "10.244.1.2", false, corev1.PodRunning, 0)
	for _, tc := range []struct {
		name string
		pods []*corev1.Pod
		want []Range
	}{
		{"live trusted pod", []*corev1.Pod{pod("old", "10.244.2.7", true, corev1.PodRunning, 1)}, []Range{r("10.244.2.7", "10.244.2.7")}},
		{"succeeded", []*corev1.Pod{pod("old", "10.244.2.7", true, corev1.PodSucceeded, 1)}, nil},
		{"failed", []*corev1.Pod{pod("old", "10.244.2.7", true, corev1.PodFailed, 1)}, nil},
		{"finished, address reused", []*corev1.Pod{pod("old", "10.244.2.7", true, corev1.PodFailed, 1),
			pod("new", "10.244.2.7", false, corev1.PodRunning, 2)}, nil},
		{"older live pod lists the reused address", []*corev1.Pod{pod("old", "10.244.2.7", true, corev1.PodRunning, 1),
			pod("new", "10.244.2.7", false, corev1.PodRunning, 2)}, nil},
		{"same, listed newer first", []*corev1.Pod{pod("new", "10.244.2.7", false, corev1.PodRunning, 2),
			pod("old", "10.244.2.7", true, corev1.PodRunning, 1)}, nil},
		{"the newer pod is the trusted one", []*corev1.Pod{pod("new", "10.244.2.7", true, corev1.PodRunning, 2),
			pod("old", "10.244.2.7", false, corev1.PodRunning, 1)}, []Range{r("10.244.2.7", "10.244.2.7")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := Compute(Input{Local: netip.MustParsePrefix("10.244.1.0/24"), Pods: append([]*corev1.Pod{server}, tc.pods...),
				Policies: []*networkingv1.NetworkPolicy{policy}})
			if len(plan.Errors) > 0 || len(plan.Rules) > 1 {
				t.Fatalf("plan %+v", plan)
			}
			var got []Range // a rule without peers allows nothing: no rule
			if len(plan.Rules) == 1 {
				got = plan.Rules[0].Peers
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("peers %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDualStackPlans: the IPv6 plan of a dual-stack pod set holds the
// pods' IPv6 addresses and the IPv6 ipBlocks, the IPv4 plan the IPv4 ones.
func TestDualStackPlans(t *testing.T) {
	a := testPod("x", "a", "10.244.1.2", 80)
	a.Status.PodIPs = []corev1.PodIP{{IP: "10.244.1.2"}, {IP: "fd00:1::2"}}
	b := testPod("x", "b", "10.244.2.2", 80)
	b.Status.PodIPs = []corev1.PodIP{{IP: "10.244.2.2"}, {IP: "fd00:2::2"}}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "p"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}}},
				{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:9::/64", Except: []string{"fd00:9::/65"}}},
				{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16"}}}}}}}
	in := Input{Pods: []*corev1.Pod{a, b}, Policies: []*networkingv1.NetworkPolicy{np}}
	in.Local = netip.MustParsePrefix("fd00:1::/64")
	v6 := Compute(in)
	in.Local = netip.MustParsePrefix("10.244.1.0/24")
	v4 := Compute(in)
	if !v6.V6 || v4.V6 {
		t.Errorf("families: v6 plan V6=%v, v4 plan V6=%v", v6.V6, v4.V6)
	}
	if !reflect.DeepEqual(v6.IngressIsolated, []netip.Addr{ip("fd00:1::2")}) || len(v6.Rules) != 1 {
		t.Fatalf("v6 plan %+v", v6)
	}
	if want := []Range{r("fd00:2::2", "fd00:2::2"), r("fd00:9::8000:0:0:0", "fd00:9::ffff:ffff:ffff:ffff")}; !reflect.DeepEqual(v6.Rules[0].Peers, want) {
		t.Errorf("v6 peers %v, want %v", v6.Rules[0].Peers, want)
	}
	if want := []Range{r("10.244.2.2", "10.244.2.2"), r("192.168.0.0", "192.168.255.255")}; !reflect.DeepEqual(v4.Rules[0].Peers, want) {
		t.Errorf("v4 peers %v, want %v", v4.Rules[0].Peers, want)
	}
}

// TestIsolatedBy: the isolated pods are grouped by the policies that
// select them, which the drop log names.
func TestIsolatedBy(t *testing.T) {
	sel := func(pods ...string) metav1.LabelSelector {
		return metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: metav1.LabelSelectorOpIn, Values: pods}}}
	}
	np := func(name string, types []networkingv1.PolicyType, s metav1.LabelSelector) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: s, PolicyTypes: types}}
	}
	in, eg := networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress
	plan := Compute(Input{Local: netip.MustParsePrefix("10.244.1.0/24"),
		Pods: []*corev1.Pod{testPod("x", "a", "10.244.1.2", 80), testPod("x", "b", "10.244.1.3", 80), testPod("x", "c", "10.244.1.4", 80)},
		Policies: []*networkingv1.NetworkPolicy{
			np("q", []networkingv1.PolicyType{in}, sel("b", "c")),
			np("p", []networkingv1.PolicyType{in, eg}, sel("a", "b")),
		}})
	wantIn := []Isolation{
		{Policies: []string{"x/p"}, Addrs: []netip.Addr{ip("10.244.1.2")}},
		{Policies: []string{"x/p", "x/q"}, Addrs: []netip.Addr{ip("10.244.1.3")}},
		{Policies: []string{"x/q"}, Addrs: []netip.Addr{ip("10.244.1.4")}},
	}
	wantEg := []Isolation{{Policies: []string{"x/p"}, Addrs: []netip.Addr{ip("10.244.1.2"), ip("10.244.1.3")}}}
	if !reflect.DeepEqual(plan.IngressBy, wantIn) || !reflect.DeepEqual(plan.EgressBy, wantEg) {
		t.Errorf("ingress by %+v\negress by %+v", plan.IngressBy, plan.EgressBy)
	}
}
