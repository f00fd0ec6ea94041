// Package kubeprobe runs `weftctl connectivity` on a Kubernetes cluster: it
// creates two probe DaemonSets (a pod per node on the pod network, and one
// on each node's network that listens on the node's VTEP address), each pod
// running `weftctl connectivity probe`; waits for their pods; hands every
// probe the list of the others of its kind through an annotation on its own
// pod; collects each probe's row of measurements from another annotation;
// and deletes the DaemonSets. It needs nothing but the API server: no pod
// logs, no exec, so no kubelet connection, and the RBAC of
// kube-manifests/weft-connectivity.yml.
package kubeprobe
