// Package extension is the extension dataplane, as Flannel's extension
// backend: weft programs nothing itself and runs the user's commands on the
// node's and its peers' lease events instead. It is for trying out a
// dataplane with a few shell lines, not for production: a command that
// fails is logged and counted, never retried.
//
// Each command is a line of shell, run as `/bin/sh -c <command>` with
// weftd's environment plus the variables below (Flannel's names). Values
// from leases reach a command only through variables and stdin, never
// spliced into the command text.
//
//   - PreStartupCommand runs before the node acquires its lease. What it
//     prints (stdout and stderr, trimmed) becomes the lease's BackendData,
//     a JSON string, which every peer reads.
//   - PostStartupCommand runs once the lease is acquired, with NETWORK (the
//     cluster network), SUBNET and IPV6SUBNET (this node's subnets),
//     PUBLIC_IP and PUBLIC_IPV6 (its public addresses). NETWORK is the IPv4
//     network, or on an IPv6-only network the IPv6 one.
//   - SubnetAddCommand runs for each peer's lease that appears, and
//     SubnetRemoveCommand for each that goes, with SUBNET and PUBLIC_IP (the
//     peer's IPv4 subnet and address) or, for a peer with no IPv4 subnet,
//     IPV6SUBNET and PUBLIC_IPV6; stdin carries the peer's BackendData
//     string (what its PreStartupCommand printed) and a newline. A peer
//     whose lease changes gets SubnetRemoveCommand for the old value, then
//     SubnetAddCommand for the new one.
//
// A variable with no value (no IPv6 subnet on an IPv4 node) is set empty.
// When weftd starts, SubnetAddCommand runs for every peer, as Flannel's
// does; commands must tolerate finding their work already done.
//
// Unlike Flannel 0.28.2 and later, which split each command on spaces and
// run it without a shell, weft runs every command through sh, as Flannel's
// documented examples need; docs/replacing-flannel.md lists the differences.
package extension
