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
// it).
//
// In iptables-nft the rules are written through nftables' netlink API
// (google/nftables), in the form the iptables-nft binary gives them, so that
// `iptables-nft -S` lists them as above and iptables-nft can still edit the
// table: regular chain WEFT-FWD in table ip (ip6) filter; each rule a match
// on the address (a payload load of the prefix's bytes and a cmp, or a load
// of the whole address, a bitwise mask and a cmp when the prefix ends
// inside a byte), a counter and an immediate verdict (accept, or jump
// WEFT-FWD), with no user data. No binary is needed (weft's image has
// none). iptables-legacy's kernel interface takes a whole table at once, so
// there the rules are written by the iptables-legacy (ip6tables-legacy)
// binary found on PATH, through coreos/go-iptables, as Flannel writes its
// own; where a legacy table is in use but its binary is missing, Run logs it
// once and goes on.
//
// # Why appended
//
// The jump is appended to FORWARD, where Flannel puts FLANNEL-FWD: it then
// overrides the chain's policy, and every rule that others put before it
// keeps its say (network policy engines, kube-proxy's drop of invalid
// packets, an admin's DOCKER-USER rules). Docker's own chains come earlier
// too; where one of them drops traffic into its bridge, DOCKER-USER rules are
// needed (see docs/configuration.md).
//
// # Repair and lifetime
//
// Run programs the rules at once and checks them every CheckInterval: a
// WEFT-FWD chain whose rules differ from the two above (missing, edited or
// extra; in iptables-nft, expressions other than the form above, as an old
// iptables-nft wrote them, count too) is flushed and written again, a
// missing jump appended again, and duplicate jumps reduced to one (in
// iptables-nft all in one transaction). A backend that comes into use later (Docker
// started after weftd) gets the rules at the next check. Run leaves the rules
// in place when it returns, so that a restarting weftd never interrupts
// traffic. With Accept off, Run removes weft's chain and jump instead.
//
// Either way, after its first pass Run removes what flanneld left: the
// FLANNEL-FWD chain (filter table) and FLANNEL-POSTRTG chain (nat table),
// with the rules that jump to them, in every iptables backend and family in
// use (in iptables-nft through nftables, in one transaction per chain), and
// the nftables tables ip flannel-ipv4 and ip6 flannel-ipv6 (Flannel
// in nftables mode). Each removal is logged. weftd owns the node's
// forwarding and masquerade after a takeover; Flannel's rules, resynced by
// no one, would otherwise linger with a stale network.
//
// Run works in the network namespace of the thread it runs on: the
// iptables-legacy processes it starts and its nftables sockets inherit it
// (tests run it under namespace.NS.Do).
package forward
