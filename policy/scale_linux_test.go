package policy

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weft-net/weft/internal/testkit/benchreport"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestScale programs 1,000 local pods and 1,000 policies (each selecting
// ten pods by label, allowing ingress from ten others on a numbered and a
// named port) and counts the kernel objects: rules grow with the
// policies' rules, never with the pods; pods only add set elements.
func TestScale(t *testing.T) {
	ns := nettest.NewNS(t, "npscale")
	const pods, policies = 1000, 1000
	in := Input{Local: netip.MustParsePrefix("10.244.0.0/22")}
	base := netip.MustParseAddr("10.244.0.1")
	a := base
	for i := range pods {
		p := testPod(fmt.Sprintf("ns%d", i%10), fmt.Sprintf("p%d", i), a.String(), 8080)
		p.Labels = map[string]string{"app": fmt.Sprintf("app%d", i/10), "role": fmt.Sprintf("r%d", i%100)}
		in.Pods = append(in.Pods, p)
		a = a.Next()
	}
	for i := range in.Pods[:10] {
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns%d", i)}})
	}
	web, http := intstr.FromString("web"), intstr.FromInt32(80)
	for i := range policies {
		in.Policies = append(in.Policies, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%10), Name: fmt.Sprintf("np%d", i)},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", i%100)}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{},
						PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprintf("r%d", i%100)}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Port: &http}, {Port: &web}},
				}},
			}})
	}
	start := time.Now()
	plan := Compute(in)
	computed := time.Since(start)
	if len(plan.Errors) > 0 {
		t.Fatal(plan.Errors)
	}
	start = time.Now()
	if err := Program(ns.Path, plan); err != nil {
		t.Fatal(err)
	}
	programmed := time.Since(start)
	conn, done, err := dial(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	tab := &nftables.Table{Name: Table, Family: nftables.TableFamilyINet}
	sets, err := conn.GetSets(tab)
	if err != nil {
		t.Fatal(err)
	}
	elements := 0
	for _, s := range sets {
		els, err := conn.GetSetElements(s)
		if err != nil {
			t.Fatal(err)
		}
		elements += len(els)
	}
	rules := 0
	for _, c := range []string{"forward", "ingress", "egress"} {
		rs, err := conn.GetRules(tab, &nftables.Chain{Name: c, Table: tab})
		if err != nil {
			t.Fatal(err)
		}
		rules += len(rs)
	}
	t.Logf("%d pods, %d policies: %d rules, %d sets, %d set elements; compute %s, program %s",
		pods, policies, rules, len(sets), elements, computed.Round(time.Millisecond), programmed.Round(time.Millisecond))
	if want := 6 + policies + 2; rules != want {
		t.Errorf("%d rules, want %d: one per policy rule and eight fixed", rules, want)
	}
	row := fmt.Sprintf("| %s local pods, %s policies (each selecting 10 pods, ingress from 10 pods on a numbered and a named port; inet table, IPv4 plan, no bridge ports) | %s rules, %s sets, %s set elements; computing the table %d ms, writing it (one transaction) %d ms |",
		thousands(pods), thousands(policies), thousands(rules), thousands(len(sets)), thousands(elements), computed.Milliseconds(), programmed.Milliseconds())
	if err := scaleReport(row); err != nil {
		t.Error(err)
	}
}

// scaleReport writes TestScale's row into the report WEFT_BENCH_REPORT
// names (docs/network-policy.md), if any, with its stamp.
func scaleReport(row string) error {
	root, err := benchreport.Root()
	if err != nil {
		return err
	}
	path := benchreport.Path(root)
	if path == "" {
		return nil
	}
	st := benchreport.NewStamp(root, "scale", "sudo WEFT_BENCH_REPORT=docs/network-policy.md go test -count=1 -run '^TestScale$' ./policy", "policy")
	stamp, err := st.Markdown(root)
	if err != nil {
		return err
	}
	load, _ := os.ReadFile("/proc/loadavg")
	text := fmt.Sprintf("%s\nLoad average at the end %s.\n\n| what | figure |\n|---|---|\n%s\n",
		stamp, strings.Join(strings.Fields(string(load))[:3], " "), row)
	return benchreport.WriteSection(path, "policy", "scale", []byte(text))
}

// thousands writes n with a comma between thousands: 22,100.
func thousands(n int) string {
	if n < 1000 {
		return fmt.Sprint(n)
	}
	return fmt.Sprintf("%s,%03d", thousands(n/1000), n%1000)
}
