// Package forward keeps the host's iptables FORWARD chains open for the
// cluster network, as Flannel's FLANNEL-FWD chain does, and removes the
// iptables chains and nftables tables that flanneld left on a node weft took
// over.
//
// # What it programs
//
// In each iptables backend the host uses (see below), for the cluster
// Network N (and the IPv6Network, with ip6tables):
//
//	-N WEFT-FWD
//	-A WEFT-FWD -s N -j ACCEPT
//	-A WEFT-FWD -d N -j ACCEPT
//	-A FORWARD -j WEFT-FWD
//
// An accept in one nftables table (weft's own, say) cannot override a drop
// in another, so a FORWARD policy DROP (Docker sets one when it turns
// forwarding on; hardened images too) can only be answered in the table
// that holds it: iptables-nft's table ip filter, or iptables-legacy's filter
// table, which nftables does not see. Both can be in use on one host, so
// each is checked on its own: iptables-legacy when the kernel lists its
// filter table in this namespace (/proc/thread-self/net/ip_tables_names),
// iptables-nft when nftables holds table ip filter with a FORWARD chain.
// A backend that is not in use gets nothing (asking for a table would create
// it). The rules are written by the iptables-legacy and iptables-nft
// binaries found on PATH (ip6tables-… for IPv6), through coreos/go-iptables,
// as Flannel writes its own; where a table is in use but its binary is
// missing, Run logs it once and goes on.
//
// # Why appended
//
// The jump is appended to FORWARD, where Flannel puts FLANNEL-FWD: it then
// overrides the chain's policy, and every rule that others put before it
// keeps its say (network policy engines, kube-proxy's drop of invalid
// packets, an admin's DOCKER-USER rules). Docker's own chains come earlier
// too; where one of them drops traffic into its bridge, DOCKER-USER rules are
// needed (see the README).
//
// # Repair and lifetime
//
// Run programs the rules at once and checks them every CheckInterval: a
// WEFT-FWD chain whose rules differ from the two above (missing, edited or
// extra) is flushed and written again, a missing jump appended again, and
// duplicate jumps reduced to one. A backend that comes into use later (Docker
// started after weftd) gets the rules at the next check. Run leaves the rules
// in place when it returns, so that a restarting weftd never interrupts
// traffic. With Accept off, Run removes weft's chain and jump instead.
//
// Either way, after its first pass Run removes what flanneld left: the
// FLANNEL-FWD chain (filter table) and FLANNEL-POSTRTG chain (nat table),
// with the rules that jump to them, in every iptables backend and family in
// use, and the nftables tables ip flannel-ipv4 and ip6 flannel-ipv6 (Flannel
// in nftables mode). Each removal is logged. weftd owns the node's
// forwarding and masquerade after a takeover; Flannel's rules, resynced by
// no one, would otherwise linger with a stale network.
//
// Run works in the network namespace of the thread it runs on: the
// iptables processes it starts and its nftables socket inherit it (tests run
// it under namespace.NS.Do).
package forward
