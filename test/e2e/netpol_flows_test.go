package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/weft-net/weft/flow"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestNetworkPolicyFlows runs weftd as weft's manifest does (Kubernetes
// mode, network policy and flows on by default) on two vxlan nodes
// against a real apiserver. With np-x/deny isolating np-x's pods for
// ingress, a connection from np-y/a (n1) to np-x/b (n2) is refused, and
// n2's weftd must show the drop on /flows with the policy that decided it
// and the direction, `weftctl flows` run on n2 must print it, and
// weft_policy_verdicts_total must count it. The connection a allows
// itself (to np-y/b, no policy) must show as allowed on both nodes.
func TestNetworkPolicyFlows(t *testing.T) { policyFlows(t) }

// TestNetworkPolicyFlowsUVXLAN is TestNetworkPolicyFlows on uvxlan nodes,
// with weftd's default tc fast path.
func TestNetworkPolicyFlowsUVXLAN(t *testing.T) { policyFlows(t, "--backend", "uvxlan") }

func policyFlows(t *testing.T, args ...string) {
	e := newNPEnv(t, args...)
	from, to := e.pod("np-y", "a"), e.pod("np-x", "b") // n1 → n2
	n2 := e.c.Nodes[1]
	e.apply(t, []*networkingv1.NetworkPolicy{npPolicy("np-x", "deny", nil, ingressOnly)})
	Eventually(t, 10*time.Second, "new connection refused", func() error {
		if try(probe{from, to, corev1.ProtocolTCP, 80}) {
			return errors.New("still allowed")
		}
		return nil
	})
	refused := time.Now()
	var drop flow.Flow
	Eventually(t, 10*time.Second, "the drop on n2's /flows", func() error {
		code, body, err := n2.HTTPGet("http://127.0.0.1:9470/flows?verdict=dropped&policy=np-x/deny&port=80&addr=" + from.ip.String())
		if err != nil || code != 200 {
			return fmt.Errorf("/flows: %d %v %s", code, err, body)
		}
		var page flow.Page
		if err := json.Unmarshal([]byte(body), &page); err != nil {
			return err
		}
		if len(page.Flows) == 0 {
			return errors.New("no drop yet")
		}
		drop = page.Flows[len(page.Flows)-1]
		return nil
	})
	t.Logf("drop on /flows %s after the refused probe ended: %+v", time.Since(refused).Round(time.Millisecond), drop)
	if drop.Src != from.ip || drop.Dst != to.ip || drop.Direction != flow.DirIngress || !slices.Equal(drop.Policies, []string{"np-x/deny"}) || drop.Node != "n2" {
		t.Errorf("drop %+v", drop)
	}
	out, err := n2.NS.Run(nettest.Binary(t, "weftctl"), "flows", "--verdict", "dropped", "--port", "80")
	if err != nil || !strings.Contains(out, "DROPPED tcp") || !strings.Contains(out, to.ip.String()+":80 default deny (ingress): destination pod selected by np-x/deny; no rule allows") {
		t.Errorf("weftctl flows on n2: %v\n%s", err, out)
	}
	if v, err := n2.Metric("weft_policy_verdicts_total", "policy", "deny", "namespace", "np-x", "direction", "ingress", "verdict", "dropped"); err != nil || v < 1 {
		t.Errorf("weft_policy_verdicts_total for np-x/deny: %v %v", v, err)
	}
	// Allowed: np-y has no policy.
	other := e.pod("np-y", "b")
	if !try(probe{from, other, corev1.ProtocolTCP, 80}) {
		t.Fatalf("%s → %s refused with no policy in np-y", from.id(), other.id())
	}
	for _, n := range e.c.Nodes {
		Eventually(t, 10*time.Second, "the allowed connection on "+n.Label+"'s /flows", func() error {
			code, body, err := n.HTTPGet("http://127.0.0.1:9470/flows?verdict=allowed&port=80&addr=" + other.ip.String())
			if err != nil || code != 200 {
				return fmt.Errorf("/flows: %d %v", code, err)
			}
			if !strings.Contains(body, `"event":"new"`) || !strings.Contains(body, `"src":"`+from.ip.String()+`"`) {
				return fmt.Errorf("no allowed flow in %s", body)
			}
			return nil
		})
	}
}
