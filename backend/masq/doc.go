// Package masq programs weft's masquerade rules with nftables: pod traffic
// that leaves the cluster network goes out with the node's address, pod to
// pod traffic never does.
//
// # What it programs
//
// One table per family, owned by weft alone (Flannel's own tables are named
// flannel-ipv4/flannel-ipv6 and are left alone), for a cluster Network N:
//
//	table ip weft-ipv4 {
//		chain postrouting {
//			type nat hook postrouting priority srcnat; policy accept;
//			ip saddr N ip daddr N return comment "weft: pod to pod, no nat"
//			ip saddr N ip daddr 224.0.0.0/4 return comment "weft: multicast, no nat"
//			ip saddr N masquerade fully-random comment "weft: pod leaving the cluster network"
//		}
//		chain forward {
//			type filter hook forward priority filter; policy accept;
//			ip saddr N accept comment "weft: from pods"
//			ip daddr N accept comment "weft: to pods"
//		}
//	}
//
// and the same in `ip6 weft-ipv6` for the IPv6Network (multicast ff00::/8).
// Node-to-pod traffic has a source outside N and is never translated, so the
// Kubernetes rule holds that a node reaches its pods without NAT.
// The forward chain accepts what a stricter chain of the same table family
// would otherwise have to; note that an accept in one nftables table does not
// override a drop in another (for example an iptables FORWARD policy DROP).
//
// # Why this way
//
// Masquerading rather than SNAT to a fixed address follows the outgoing
// interface's address; fully-random port selection avoids the source-port
// collisions that plain masquerade hits when many pods talk to one
// destination. The table is replaced in one nftables transaction, so the
// rules are never missing even while they are rewritten.
//
// # Repair and lifetime
//
// Run programs the tables at once and then checks them every CheckInterval
// (5 s, like Flannel's resync): a table that is missing, a chain with the
// wrong hook, or rules that are not exactly weft's (compared in order,
// comment and expressions, so a deleted, added or edited rule is noticed)
// makes Run write the whole table again. Run leaves the tables in place when it returns, so a
// restarting weftd never interrupts traffic; Remove deletes them, for a node
// that turns masquerading off.
package masq
