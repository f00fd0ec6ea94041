package kubeprobe

import (
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDaemonSet(t *testing.T) {
	ds := Spec{Run: "abc123", Image: "ghcr.io/weft-net/weft:v1", Port: 9471, Count: 3, Timeout: "1s"}.DaemonSet()
	if ds.Name != "weft-probe-abc123" || ds.Labels[LabelRun] != "abc123" ||
		!reflect.DeepEqual(ds.Spec.Selector.MatchLabels, map[string]string{"connectivity.weft-net.github.io/run": "abc123", "connectivity.weft-net.github.io/kind": "pod"}) {
		t.Errorf("name %q labels %v selector %v", ds.Name, ds.Labels, ds.Spec.Selector)
	}
	pod := ds.Spec.Template.Spec
	c := pod.Containers[0]
	if got := strings.Join(append(c.Command, c.Args...), " "); got != "weftctl connectivity probe --port 9471 --count 3 --timeout 1s" {
		t.Errorf("command %q", got)
	}
	if pod.ServiceAccountName != "weft-probe" || pod.HostNetwork || len(pod.Tolerations) != 1 || pod.Tolerations[0].Operator != corev1.TolerationOpExists {
		t.Errorf("pod spec %+v", pod)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.ValueFrom.FieldRef.FieldPath
	}
	if !reflect.DeepEqual(env, map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "NODE_NAME": "spec.nodeName"}) {
		t.Errorf("env %v", env)
	}
	if c.ReadinessProbe.TCPSocket.Port.IntValue() != 9471 || !reflect.DeepEqual(c.SecurityContext.Capabilities.Add, []corev1.Capability{"NET_RAW"}) ||
		!reflect.DeepEqual(c.SecurityContext.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("readiness %+v security %+v", c.ReadinessProbe, c.SecurityContext)
	}
}

func TestSplitReady(t *testing.T) {
	ready := corev1.PodStatus{PodIP: "10.244.1.3", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	now := metav1.NewTime(time.Now())
	pods := []corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: corev1.PodSpec{NodeName: "n2"}, Status: ready},
		{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: corev1.PodSpec{NodeName: "n1"}, Status: ready},
		{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: corev1.PodSpec{NodeName: "n3"}, Status: corev1.PodStatus{Phase: corev1.PodPending,
			ContainerStatuses: []corev1.ContainerStatus{{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "not found"}}}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "d"}, Status: corev1.PodStatus{Phase: corev1.PodPending}},
		{ObjectMeta: metav1.ObjectMeta{Name: "e", DeletionTimestamp: &now}, Spec: corev1.PodSpec{NodeName: "n4"}, Status: ready},
		{ObjectMeta: metav1.ObjectMeta{Name: "f"}, Spec: corev1.PodSpec{NodeName: "n5"}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}}},
	}
	r, targets, nr, notes := splitReady(pods, false)
	if len(r) != 2 || r[0].Name != "a" || r[1].Name != "b" || len(notes) != 0 ||
		!reflect.DeepEqual(targets, []Target{{Node: "n1", IP: "10.244.1.3"}, {Node: "n2", IP: "10.244.1.3"}}) {
		t.Errorf("ready %v targets %v notes %v", r, targets, notes)
	}
	want := []string{
		"node (not scheduled): probe pod d not ready (Pending)",
		"node n3: probe pod c not ready (Pending: ImagePullBackOff not found)",
		"node n5: probe pod f not ready (Running)",
	}
	if !reflect.DeepEqual(nr, want) {
		t.Errorf("not ready:\n%q\nwant\n%q", nr, want)
	}
}

func TestSplitReadyHost(t *testing.T) {
	status := corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "192.168.77.1", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	pod := func(name, node, endpoint string) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: node}, Status: status}
		if endpoint != "" {
			p.Annotations = map[string]string{AnnotationEndpoint: endpoint}
		}
		return p
	}
	r, targets, nr, notes := splitReady([]corev1.Pod{pod("a", "n1", "10.244.1.0"), pod("b", "n2", ""), pod("c", "n3", "none: no overlay device")}, true)
	if len(r) != 1 || !reflect.DeepEqual(targets, []Target{{Node: "n1", IP: "10.244.1.0"}}) ||
		!reflect.DeepEqual(nr, []string{"node n2: probe pod b not ready (Running)"}) ||
		!reflect.DeepEqual(notes, []string{"node n3: not measured node to node: no overlay device"}) {
		t.Errorf("ready %v targets %v not ready %q notes %q", r, targets, nr, notes)
	}
}

func TestHostDaemonSet(t *testing.T) {
	s := Spec{Run: "abc123", Image: "x", Port: 9471, Count: 3, Timeout: "1s", Host: true}
	ds := s.DaemonSet()
	pod := ds.Spec.Template.Spec
	c := pod.Containers[0]
	if ds.Name != "weft-probe-host-abc123" || !pod.HostNetwork || pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet ||
		c.Args[len(c.Args)-1] != "--host" || c.ReadinessProbe != nil || len(c.Ports) != 0 {
		t.Errorf("host DaemonSet %s: %+v", ds.Name, pod)
	}
	if s.Selector() != "connectivity.weft-net.github.io/run=abc123,connectivity.weft-net.github.io/kind=host" ||
		ds.Spec.Template.Labels[LabelKind] != KindHost {
		t.Errorf("selector %q labels %v", s.Selector(), ds.Spec.Template.Labels)
	}
}
