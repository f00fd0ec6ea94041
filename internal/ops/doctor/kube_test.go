package doctor

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weft-net/weft/subnet"
)

func TestKubeChecks(t *testing.T) {
	p := "flannel.alpha.coreos.com/"
	mac, _ := subnet.ParseMAC("02:00:00:00:00:01")
	facts := kubeFacts{network: netip.MustParsePrefix("10.244.0.0/16"), publicIP: netip.MustParseAddr("192.168.77.1"), mac: mac}
	good := func() *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{
				p + "kube-subnet-manager": "true", p + "backend-type": "vxlan", p + "public-ip": "192.168.77.1",
				p + "backend-data": `{"VNI":1,"VtepMAC":"02:00:00:00:00:01"}`}},
			Spec:   corev1.NodeSpec{PodCIDR: "10.244.1.0/24"},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: "WeftIsUp"}}},
		}
	}
	tests := []struct {
		name   string
		edit   func(*corev1.Node)
		check  string // the check that must not be ok ("" for all ok)
		status Status
		want   string // in its evidence
	}{
		{"healthy", func(*corev1.Node) {}, "", OK, ""},
		{"no podCIDR", func(n *corev1.Node) { n.Spec.PodCIDR = "" }, "kube/podcidr", Fail, "no spec.podCIDR"},
		{"podCIDR outside the network", func(n *corev1.Node) { n.Spec.PodCIDR = "10.9.1.0/24" }, "kube/podcidr", Fail, "outside the network 10.244.0.0/16"},
		{"network unavailable", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionTrue }, "kube/network-unavailable", Fail, "NetworkUnavailable=True"},
		{"no condition", func(n *corev1.Node) { n.Status.Conditions = nil }, "kube/network-unavailable", Warn, "no NetworkUnavailable condition"},
		{"stale public IP", func(n *corev1.Node) { n.Annotations[p+"public-ip"] = "192.168.77.9" }, "kube/annotations", Fail, `public-ip is "192.168.77.9" but this node sends VXLAN from 192.168.77.1`},
		{"stale VTEP MAC", func(n *corev1.Node) { n.Annotations[p+"backend-data"] = `{"VNI":1,"VtepMAC":"02:00:00:00:00:99"}` }, "kube/annotations", Fail, "02:00:00:00:00:01"},
		{"not managed", func(n *corev1.Node) { delete(n.Annotations, p+"kube-subnet-manager") }, "kube/annotations", Fail, "kube-subnet-manager"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := good()
			tt.edit(n)
			checks := kubeChecks(n, "", facts)
			if len(checks) != 3 {
				t.Fatalf("%d checks, want 3: %+v", len(checks), checks)
			}
			for _, c := range checks {
				if c.Name != tt.check {
					if c.Status != OK {
						t.Errorf("%s: %s: %s", c.Name, c.Status, c.Evidence)
					}
					continue
				}
				if c.Status != tt.status || !strings.Contains(c.Evidence, tt.want) || c.Fix == "" {
					t.Errorf("%s = %s %q (fix %q), want %s with %q", c.Name, c.Status, c.Evidence, c.Fix, tt.status, tt.want)
				}
			}
		})
	}
}

func TestReport(t *testing.T) {
	r := &Report{Node: "n"}
	r.ok("a", "fine")
	if r.ExitCode() != 0 {
		t.Fatal("all ok must exit 0")
	}
	r.add("b", Warn, "do x", "meh")
	if r.ExitCode() != 1 {
		t.Fatal("a warning must exit 1")
	}
	r.add("c", Fail, "do y", "bad")
	var b strings.Builder
	r.Render(&b)
	if r.ExitCode() != 2 || !strings.Contains(b.String(), "3 checks: 1 ok, 1 warn, 1 fail") || !strings.Contains(b.String(), "fix: do y") {
		t.Fatalf("exit %d:\n%s", r.ExitCode(), b.String())
	}
	b.Reset()
	r.JSON(&b)
	if !strings.Contains(b.String(), `"status": "warn"`) || !strings.Contains(b.String(), `"fix": "do y"`) {
		t.Fatalf("json:\n%s", b.String())
	}
}
