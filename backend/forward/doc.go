// Package forward keeps the host's iptables FORWARD chains open for the
// cluster network, as Flannel's FLANNEL-FWD chain does, and removes the
// iptables chains and nftables tables that flanneld left on a node weft took
// over.
//
// In each iptables backend the host uses, for the cluster Network N (and the
// IPv6Network, with ip6tables), it programs:
//
//	-N WEFT-FWD
//	-A WEFT-FWD -s N -j ACCEPT
//	-A WEFT-FWD -d N -j ACCEPT
//	-A FORWARD -j WEFT-FWD
//
// An accept in another table cannot override a drop, so the rules go into
// the table that holds FORWARD's policy: iptables-legacy's filter table when
// the kernel lists it in this namespace (/proc/thread-self/net/ip_tables_names),
// iptables-nft's when nftables holds table ip filter with a FORWARD chain;
// both when both are in use; a backend not in use gets nothing. In
// iptables-nft the rules are written through nftables' netlink API
// (google/nftables) in the form the iptables-nft binary writes (nftTables),
// so no binary is needed; iptables-legacy takes a whole table at once, so
// there the iptables-legacy (ip6tables-legacy) binary on PATH writes them
// (coreos/go-iptables), and without it Run logs so once and goes on. The
// jump is appended, where Flannel puts FLANNEL-FWD: it overrides the policy
// and rules others put before it keep their say.
//
// Run programs the rules and checks them after every nftables transaction
// that touched a table named filter (the kernel notifies it) and every
// Resync, and iptables-legacy's (no notice) every CheckInterval: a WEFT-FWD
// chain whose rules differ is written again, a missing jump appended,
// duplicate jumps reduced to one; a backend that comes into use later gets
// the rules at the next check. The rules stay when Run returns, so a
// restarting weftd never interrupts traffic; with Accept off Run removes
// them. After its first pass Run removes, logged, what flanneld left: the
// FLANNEL-FWD and FLANNEL-POSTRTG chains and their jumps in every backend
// and family in use, and the tables ip flannel-ipv4 and ip6 flannel-ipv6.
// Run works in the network namespace of the thread it runs on (tests run it
// under namespace.NS.Do). docs/configuration.md says how to use it.
package forward
