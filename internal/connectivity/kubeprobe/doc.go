// Package kubeprobe runs `weftctl connectivity` on a Kubernetes cluster: it
// creates a probe DaemonSet (one pod per node, each running `weftctl
// connectivity probe`), waits for its pods, hands every probe the list of
// the others through an annotation on its own pod, collects each probe's
// row of measurements from another annotation, and deletes the DaemonSet.
// It needs nothing but the API server: no pod logs, no exec, so no kubelet
// connection, and the RBAC of kube-manifests/weft-connectivity.yml.
package kubeprobe
