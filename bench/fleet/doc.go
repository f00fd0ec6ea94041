// Package fleet benchmarks weft's etcd registry at fleet scale: many nodes
// (1,000 by default), each running the real registry code with its own etcd
// client, lease and watch, against a 3-member etcd cluster that runs in a
// process of its own so its CPU can be told apart. Run it as:
//
//	go test -run '^$' -bench Fleet -benchtime 1x -timeout 30m ./bench/fleet
//
// WEFT_FLEET_NODES changes the number of nodes and WEFT_FLEET_PROBES the
// number of leases added and removed. It prints the figures; it asserts
// nothing about them. TestFleetSmall runs the same harness with a few nodes
// as a test, so the harness itself stays working.
//
// What grows with the fleet: every node watches the whole subnets prefix,
// so each lease change is sent to every node (etcd's work per change grows
// with the number of nodes), and every node holds a gRPC connection and a
// watch on etcd (etcd's memory grows with it). The benchmark prints etcd's
// CPU per change and its memory for the fleet it ran, to extrapolate from.
// The etcd cluster runs behind etcdlocal's fault-injection proxies, whose
// CPU and memory count as etcd's here.
//
// BenchmarkKubeFleet does the same in Kubernetes mode: a real kube-apiserver
// (internal/testkit/kubetest) holding 1,000 Nodes with kubelet-sized status, and
// 1,000 watchers in this process, each the real kube registry with its own
// client, HTTP connection and Node informer. It prints how long a new and a
// deleted Node take to reach every watcher, and the heap the watchers hold
// per Node (each watcher caches every Node, trimmed to what a lease needs):
//
//	go test -run '^$' -bench KubeFleet -benchtime 1x -timeout 30m ./bench/fleet
//
// WEFT_FLEET_KUBE_NODES and WEFT_FLEET_KUBE_WATCHERS change the sizes.
// TestKubeFleetSmall runs it with 10 watchers of 20 Nodes as a test.
// The watchers start 32 at a time. README.md says where it stops scaling
// and has the last reports.
package fleet
