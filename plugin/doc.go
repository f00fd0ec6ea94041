// Package plugin is weft's CNI plugin: it reads the node's subnet file
// (written by weftd or by flanneld, same format) and wires a pod in one
// process, with no delegate plugins: the node bridge with the gateway
// address, a veth pair into the pod, an address from the node subnet
// (host-local's allocator and file-locked store from
// containernetworking/plugins, linked in as a library), the pod's routes,
// hairpin mode and, when the daemon does not masquerade, an nftables
// masquerade rule.
//
// Commands: ADD, DEL (idempotent), CHECK, GC and STATUS (CNI 1.1), VERSION;
// cniVersion 0.3.0 to 1.1.0.
//
// # DEL without waiting for the kernel
//
// Deleting a veth pair costs ~15 ms in the kernel (an rcu_barrier), most of
// a DEL. DEL therefore retires the pair: one request sets the host end down
// (the pod end loses its carrier: the pod can send nothing more), takes it
// off the bridge, renames it weftrm<ifindex> and puts it in link group
// 0x77656674 ("weft"); the pod end, if the namespace is still there, is
// renamed the same way, so a new ADD may reuse both names at once. The
// addresses are released, and DEL starts the plugin's own executable again
// with the argument reap-retired-veths, detached (own session, no stdio),
// to delete every link of that group in one request. A reaper that was
// killed leaves links the next DEL's reaper or GC deletes. An older kernel
// that refuses to rename a link that is up gets it taken down first; if
// retiring fails at all, DEL deletes the pair before it returns, as before.
//
// # Errors
//
// Every failure is a CNI error on stdout with one of the spec's codes:
//
//	1   incompatible cniVersion
//	2   unsupported field (an "ipam" section: weft allocates itself)
//	3   CHECK: the netns or the pod interface is gone
//	4   invalid environment (CNI_NETNS that is not a network namespace, …)
//	6   the configuration is not JSON
//	7   invalid network configuration (wrong field type or value, bad subnet file)
//	11  try again later (no subnet file yet, no free address in the node subnet)
//	50  STATUS: the subnet file is missing or unreadable
//	100 CHECK: the attachment drifted from prevResult (address, route, veth)
//	999 any other failure (a netlink or nftables error), with its message
//
// # State under dataDir (default /var/lib/cni/weft)
//
// ipam/<network>/ holds one file per allocated address (named by the
// address, holding "containerID\r\nifname", as host-local writes it). Two
// files persist on purpose: "lock" (the flock shared by concurrent plugin
// runs) and "last_reserved_ip.<n>" (round-robin position, so a released
// address is not reused at once). Nothing else is written; the host veth
// name is derived from containerID and ifname, so DEL needs no state.
package plugin
