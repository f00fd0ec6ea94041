// Package plugin is weft's CNI plugin: it reads the node's subnet file
// (written by weftd or by flanneld, same format) and wires a pod in one
// process, with no delegate plugins: the node bridge with the gateway
// address, a veth pair into the pod, an address from the node subnet
// (allocated as host-local allocates, in host-local's file-locked store
// from containernetworking/plugins, which it shares with host-local), the
// pod's routes, hairpin mode and, when the daemon does not masquerade, an
// nftables masquerade rule.
//
// Commands: ADD, DEL (idempotent), CHECK, GC and STATUS (CNI 1.1), VERSION;
// cniVersion 0.3.0 to 1.1.0.
//
// # DEL
//
// DEL deletes the pod's veth pair before it returns: the host end, by its
// derived name (a link of that name that is not a veth stays), and with it
// the pod end, wherever it is. It then releases the addresses. A missing link or namespace is not an
// error, so DEL is idempotent, and an ADD of the same container, netns and
// ifname right after it starts from nothing.
//
// # Errors
//
// Every failure is a CNI error on stdout with one of the spec's codes:
//
//	1   incompatible cniVersion
//	2   unsupported field: a key of Flannel's entry, its delegate (the
//	    bridge plugin) or its ipam section (host-local) that weft does not
//	    implement, named in the message (README.md has the table)
//	3   CHECK: the netns or the pod interface is gone
//	4   invalid environment (CNI_NETNS that is not a network namespace, …)
//	6   the configuration is not JSON
//	7   invalid network configuration (wrong field type or value, bad subnet
//	    file, a requested address or MAC that cannot be given)
//	11  try again later (no subnet file yet, no free address in the node subnet)
//	50  STATUS: the subnet file is missing or unreadable
//	100 CHECK: the attachment drifted from prevResult (address, route, veth)
//	999 any other failure (a netlink or nftables error), with its message
//
// # Address store
//
// Addresses are reserved in host-local's store, in the directory host-local
// uses for the same configuration: <ipam.dataDir>/<network name>, where
// ipam.dataDir defaults to /var/lib/cni/networks as host-local's does. For
// Flannel's conflist (weft installed as "flannel") that is where Flannel's
// plugin has host-local keep it: Flannel hands host-local the network name
// and the ipam section of its own entry (an ipam section in "delegate" is
// refused, by Flannel and by weft). So a node moves between Flannel and weft
// with pods running and no address is handed out twice: each plugin sees
// the other's reservations, weft's DEL frees what host-local reserved for
// the attachment, and GC releases the reservations whose attachment the
// runtime does not list, whoever made them.
//
// The directory holds one file per reserved address (named by the address,
// holding "containerID\r\nifname", as host-local writes it). Two files
// persist on purpose: "lock" (the flock that serialises weft's and
// host-local's runs) and "last_reserved_ip.<n>" (round-robin position in
// range n, so a released address is not reused at once). The host veth
// name is derived from containerID and ifname, so DEL needs no other state.
//
// # Flannel's keys
//
// As "flannel" the plugin reads Flannel's entry, its "delegate" (the
// bridge plugin's configuration) and its "ipam" section (host-local's) and
// wires the pod as that chain would, with the bridge plugin's defaults
// where Flannel sets none; every key it does not implement is refused
// (code 2). It writes Flannel's per-pod state file,
// <dataDir>/<containerID> (dataDir defaulting to /var/lib/cni/flannel),
// holding what Flannel would hand its delegate, so that Flannel's DEL after
// a rollback frees the pod; DEL and GC remove it.
package plugin
