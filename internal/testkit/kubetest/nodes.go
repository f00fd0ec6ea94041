package kubetest

import (
	"encoding/json"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// flannelAnn is the prefix of the lease annotations (Flannel's, weft's default).
const flannelAnn = "flannel.alpha.coreos.com/"

// PeerNode is Node number i as a kubelet and a weft (or flanneld) node
// would leave it, for benchmarks with many peers: named peer-NNNNN, podCIDR
// 10.(n/256).(n%256).0/24 with n = i+1, the lease annotations of a vxlan
// node behind 100.64.0.0/10 (never sent traffic), and a status of the usual
// size (conditions, capacity, addresses, 30 images) that weft's informer
// drops.
func PeerNode(i int) *corev1.Node {
	n := i + 1
	sn := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(n >> 8), byte(n), 0}), 24)
	pub := netip.AddrFrom4([4]byte{100, 64 + byte(n>>16), byte(n >> 8), byte(n)})
	bd, _ := json.Marshal(subnet.VXLANData{VNI: 1, VtepMAC: vtep.DeviceMAC(pub, 1)})
	name := fmt.Sprintf("peer-%05d", i)
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
			Annotations: map[string]string{flannelAnn + "kube-subnet-manager": "true", flannelAnn + "backend-type": "vxlan",
				flannelAnn + "backend-data": string(bd), flannelAnn + "public-ip": pub.String()}},
		Spec: corev1.NodeSpec{PodCIDR: sn.String(), PodCIDRs: []string{sn.String()}},
		Status: corev1.NodeStatus{
			Capacity:  corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: pub.String()}},
		},
	}
	for _, c := range []corev1.NodeConditionType{"Ready", "MemoryPressure", "DiskPressure", "PIDPressure"} {
		node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{Type: c, Status: "False",
			Reason: "KubeletHasSufficient" + string(c), Message: "kubelet has sufficient resources available for " + string(c)})
	}
	for j := range 30 {
		node.Status.Images = append(node.Status.Images, corev1.ContainerImage{SizeBytes: 1 << 26,
			Names: []string{fmt.Sprintf("registry.example.com/team/app-%02d@sha256:%064x", j, j), fmt.Sprintf("registry.example.com/team/app-%02d:v1.%d", j, j)}})
	}
	return node
}
