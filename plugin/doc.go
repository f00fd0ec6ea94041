// Package plugin is weft's CNI plugin (also installed as "flannel"). It
// reads the node's subnet file, written by weftd or flanneld in the same
// format, and wires a pod in one process, with no delegate plugins: the
// node bridge holding the gateway address of each family, a veth pair into
// the pod, an address per family from the node subnet, the pod's routes,
// hairpin mode and, when the daemon does not masquerade, an nftables
// masquerade rule. Commands: ADD, DEL, CHECK, GC and STATUS (CNI 1.1) and
// VERSION, for cniVersion 0.3.0 to 1.1.0.
//
// Addresses live in host-local's file-locked store (containernetworking/
// plugins' disk.Store), in the directory host-local uses for the same
// configuration: <ipam.dataDir>/<network name>, by default under
// /var/lib/cni/networks. Under Flannel's conflist that is where Flannel's
// plugin has host-local keep it, so a node moves between Flannel and weft
// with pods running and no address is handed out twice; GC releases the
// reservations whose attachment the runtime does not list, whoever made
// them. Allocation is round-robin, as host-local's.
//
// As "flannel" the plugin reads Flannel's entry, its delegate (the bridge
// plugin's keys) and its ipam section (host-local's), wires the pod as that
// chain would and refuses (code 2) every key it does not implement. It
// writes Flannel's per-pod state file, <dataDir>/<containerID>, so that
// Flannel's DEL after a rollback frees the pod; DEL and GC remove it.
//
// DEL removes the pod's veth pair before it returns, whoever wired it: the
// interface CNI_IFNAME in CNI_NETNS when it is a veth paired with a port of
// the network's bridge (both ends and both namespaces checked), as the
// bridge plugin's DEL does, so a pod Flannel's chain wired goes too; else
// weft's host end by its derived name. Then it frees the addresses and,
// with the network's last pod, its masquerade chain. A missing namespace or
// link is not an error, and a link of another owner stays.
//
// Errors are CNI errors with the spec's codes: 1 incompatible cniVersion,
// 2 unsupported field, 3 CHECK: interface or netns gone, 4 invalid
// environment, 6 not JSON, 7 invalid configuration, 11 try again later (no
// subnet file yet, node subnet full), 50 STATUS: subnet file missing, 100
// CHECK: the attachment drifted, 999 anything else, with its message.
package plugin
