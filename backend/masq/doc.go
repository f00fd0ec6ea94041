// Package masq programs weft's masquerade rules with nftables: pod traffic
// that leaves the cluster network goes out with the node's address, pod to
// pod traffic never does.
//
// One table per family, owned by weft alone, for a cluster Network N and this
// node's subnet S:
//
//	table ip weft-ipv4 {
//		chain postrouting {
//			type nat hook postrouting priority srcnat; policy accept;
//			meta mark & 0x4000 == 0x4000 return comment "weft: kube-proxy masquerades it"
//			ip saddr N ip daddr N return comment "weft: pod to pod, no nat"
//			ip saddr N ip daddr 224.0.0.0/4 return comment "weft: multicast, no nat"
//			ip saddr N masquerade fully-random comment "weft: pod leaving the cluster network"
//			ip saddr != N ip daddr S return comment "weft: to this node's pods, no nat"
//			ip saddr != N ip daddr N masquerade fully-random comment "weft: to other nodes' pods from outside the cluster network"
//		}
//	}
//
// and the same in `ip6 weft-ipv6` for the IPv6Network (multicast ff00::/8);
// with Config.KeepPorts (flanneld's --ip-masq-fully-random-disable) the two
// masquerades are plain, keeping a flow's source port when it is free.
// Traffic from this node to its own pods has a source outside N and is never
// translated (a node reaches its pods without NAT). Traffic from outside N to other nodes'
// pods leaves with this node's address, so the answer comes back through it.
// What kube-proxy marks it masquerades itself (a NodePort's traffic): weft
// leaves it alone, so nothing is translated twice.
//
// The forward accepts are not here: an accept in this table could not
// override a drop in another, so they live in the iptables FORWARD chains
// (package backend/forward). How this rule set differs from Flannel's is in
// docs/configuration.md.
//
// Run writes each table in one nftables transaction (never missing while
// rewritten) and checks it after every transaction that touched it and every
// CheckInterval: a missing table, a wrong hook, or rules that are not exactly
// weft's (in order, comments and expressions) get the table written again.
// The tables stay when Run returns, so a restarting weftd never interrupts
// traffic; Remove deletes them, for a node that turns masquerading off.
package masq
