package kubeprobe

import (
	"encoding/json"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The names a run uses on its objects.
const (
	Prefix = "connectivity.weft-net.github.io/"
	// LabelRun on the DaemonSet and its pods names the run.
	LabelRun = Prefix + "run"
	// AnnotationTargets on a probe pod is the JSON list of the probes it
	// measures, written by weftctl once every probe is ready.
	AnnotationTargets = Prefix + "targets"
	// AnnotationResult on a probe pod is its JSON row, written by the probe.
	AnnotationResult = Prefix + "result"
	// LabelKind says which probes a DaemonSet runs: KindPod (on the pod
	// network) or KindHost (on the node's network, for node to node).
	LabelKind = Prefix + "kind"
	KindPod   = "pod"
	KindHost  = "host"
	// AnnotationEndpoint on a host probe's pod is the address it answers
	// on, the node's VTEP address, or "none: <why>" without an overlay
	// device; written by the probe once it listens.
	AnnotationEndpoint = Prefix + "endpoint"
	// LabelName=NameProbe marks every probe DaemonSet and pod.
	LabelName = "app.kubernetes.io/name"
	NameProbe = "weft-probe"
	// ServiceAccount is the probes' account (kube-manifests/weft-connectivity.yml).
	ServiceAccount = "weft-probe"
)

// Target is one probe as the others see it.
type Target struct {
	Node string `json:"node"`
	IP   string `json:"ip"`
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// Spec describes the probe DaemonSet of one run.
type Spec struct {
	Run     string // the run's ID, in the DaemonSet's name and labels
	Image   string // an image with weftctl on its PATH (weft's image)
	Port    int    // the probes' TCP echo port
	Count   int    // echo requests per pair
	Timeout string // per request and TCP exchange, as a duration flag
	// Host makes the probes run on the nodes' network and measure the
	// nodes' VTEP addresses (node to node, over the overlay).
	Host bool
}

func (s Spec) kind() string {
	if s.Host {
		return KindHost
	}
	return KindPod
}

// Name is the DaemonSet's name.
func (s Spec) Name() string {
	if s.Host {
		return "weft-probe-host-" + s.Run
	}
	return "weft-probe-" + s.Run
}

// Selector selects the DaemonSet's pods.
func (s Spec) Selector() string { return LabelRun + "=" + s.Run + "," + LabelKind + "=" + s.kind() }

// DaemonSet returns the probe DaemonSet: a pod on every node (it tolerates
// every taint), on the pod network, with NET_RAW for ICMP and nothing
// else, ready when its TCP echo server answers.
func (s Spec) DaemonSet() *appsv1.DaemonSet {
	labels := map[string]string{LabelName: NameProbe, "app.kubernetes.io/managed-by": "weftctl", LabelRun: s.Run, LabelKind: s.kind()}
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	grace, root, no := int64(2), int64(0), false
	port := intstr.FromInt(s.Port)
	c := corev1.Container{
		Name:    "probe",
		Image:   s.Image,
		Command: []string{"weftctl", "connectivity", "probe"},
		Args:    []string{"--port", strconv.Itoa(s.Port), "--count", strconv.Itoa(s.Count), "--timeout", s.Timeout},
		Env: []corev1.EnvVar{
			{Name: "POD_NAME", ValueFrom: field("metadata.name")},
			{Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
			{Name: "NODE_NAME", ValueFrom: field("spec.nodeName")},
		},
		Ports:          []corev1.ContainerPort{{Name: "echo", ContainerPort: int32(s.Port), Protocol: corev1.ProtocolTCP}},
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: port}}, PeriodSeconds: 1},
		SecurityContext: &corev1.SecurityContext{
			RunAsUser:                &root, // raw ICMP sockets need NET_RAW in the effective set
			AllowPrivilegeEscalation: &no,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_RAW"}},
		},
	}
	if s.Host {
		// On the node's network the port is not the pod's own: the probe
		// listens on the VTEP address only and says when it does.
		c.Args = append(c.Args, "--host")
		c.Ports, c.ReadinessProbe = nil, nil
	}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name(), Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelRun: s.Run, LabelKind: s.kind()}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName:            ServiceAccount,
					HostNetwork:                   s.Host,
					DNSPolicy:                     dnsPolicy(s.Host),
					TerminationGracePeriodSeconds: &grace,
					Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers:                    []corev1.Container{c},
				},
			},
		},
	}
}

func dnsPolicy(host bool) corev1.DNSPolicy {
	if host {
		return corev1.DNSClusterFirstWithHostNet
	}
	return corev1.DNSClusterFirst
}
