package doctor

import "github.com/weft-net/weft/internal/ops/inspect"

// checkKube runs the Kubernetes checks against the node object.
func checkKube(s *state) {
	var f kubeFacts
	if s.Config != nil {
		f.network = s.Config.Network
	}
	if s.k != nil {
		f.mac = s.k.Device.MAC
		f.publicIP = s.k.Device.Local
		if s.k.Device.Kind != inspect.KindVXLAN && s.self != nil {
			f.publicIP = s.self.Attrs.PublicIP
		}
	}
	if s.Kube.Node == nil {
		s.r.add("kube/node", Fail, "pass --node-name (or set NODE_NAME) to this node's name", "no node object to check")
		return
	}
	s.r.Checks = append(s.r.Checks, kubeChecks(s.Kube.Node, s.Kube.AnnotationPrefix, f)...)
}
