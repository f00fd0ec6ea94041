package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/weft-net/weft/flow"
	"github.com/weft-net/weft/internal/testkit/kubecluster"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// checkFlows isolates pod dst's ingress with a NetworkPolicy that allows
// nothing, has pod src try to reach it, and checks that weftctl flows
// --kubeconfig (port-forwarded to every weftd pod, as users run it) shows
// the drop on dst's node with the policy that decided it, and that src's
// allowed connection before the policy shows too. The policy and the label
// are removed at the end.
func checkFlows(t *testing.T, ctx context.Context, s *kubecluster.State, c kubernetes.Interface, src, dst *corev1.Pod) {
	weftctl := nettest.Binary(t, "weftctl")
	// An allowed connection first: it shows as allowed on a node.
	podExec(t, ctx, s, src.Name, "httpget", "http://"+dst.Status.PodIP+":8080/")
	if _, err := s.Kubectl(ctx, kubeBin(t), "label", "pod", dst.Name, "flows=isolated"); err != nil {
		t.Fatal(err)
	}
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "flows-deny"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"flows": "isolated"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	if _, err := c.NetworkingV1().NetworkPolicies("default").Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.NetworkingV1().NetworkPolicies("default").Delete(context.Background(), np.Name, metav1.DeleteOptions{})
		s.Kubectl(context.Background(), kubeBin(t), "label", "pod", dst.Name, "flows-")
	})
	// The policy takes effect within a few seconds; each refused try is
	// logged as a drop.
	refused := false
	for end := time.Now().Add(time.Minute); time.Now().Before(end) && !refused; time.Sleep(time.Second) {
		_, err := s.Kubectl(ctx, kubeBin(t), "exec", src.Name, "--", "timeout", "3", "httpget", "http://"+dst.Status.PodIP+":8080/")
		refused = err != nil
	}
	if !refused {
		t.Fatalf("%s still reaches %s a minute after NetworkPolicy flows-deny isolated it", src.Name, dst.Name)
	}
	var drops, allowed []flow.Flow
	var last string
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		out, err := exec.CommandContext(ctx, weftctl, "flows", "--kubeconfig", s.Kubeconfig, "--json", "--limit", "0",
			"--pod", "default/"+dst.Name).CombinedOutput()
		last = string(out)
		if err != nil {
			continue
		}
		drops, allowed = nil, nil
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			var f flow.Flow
			if json.Unmarshal(sc.Bytes(), &f) != nil {
				continue
			}
			if f.Src.String() != src.Status.PodIP || f.Dst.String() != dst.Status.PodIP || f.DstPort != 8080 {
				continue
			}
			switch f.Verdict {
			case "dropped":
				if f.Direction == "ingress" && slices.Contains(f.Policies, "default/flows-deny") && f.Node == dst.Spec.NodeName {
					drops = append(drops, f)
				}
			case "allowed":
				allowed = append(allowed, f)
			}
		}
		if len(drops) > 0 && len(allowed) > 0 {
			t.Logf("weftctl flows: %d drops by default/flows-deny on %s, %d allowed flows", len(drops), dst.Spec.NodeName, len(allowed))
			return
		}
	}
	t.Fatalf("weftctl flows --kubeconfig shows %d drops by default/flows-deny on %s and %d allowed flows from %s to %s:8080, want both; last output:\n%s",
		len(drops), dst.Spec.NodeName, len(allowed), src.Status.PodIP, dst.Status.PodIP, tail(fmt.Sprint(last), 20))
}
