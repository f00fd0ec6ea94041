// Package masq programs weft's masquerade rules with nftables: pod traffic
// that leaves the cluster network goes out with the node's address, pod to
// pod traffic never does.
//
// # What it programs
//
// One table per family, owned by weft alone, for a cluster Network N and this
// node's subnet S (Flannel's rule set, see below for the differences):
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
// and the same in `ip6 weft-ipv6` for the IPv6Network (multicast ff00::/8).
// Node-to-pod traffic on this node has a source outside N and is never
// translated, so the Kubernetes rule holds that a node reaches its pods
// without NAT. Traffic from outside N to other nodes' pods (a node without
// an overlay address, a router sending outside traffic through this node)
// leaves with this node's address, so that the answer comes back through
// it. kube-proxy marks what it masquerades itself (a NodePort's traffic) and
// weft leaves it alone, so nothing is translated twice.
//
// The forward accepts are not here: an accept in this table could not
// override a drop in another, so they live in the iptables FORWARD chains
// (package backend/forward).
//
// # Differences from Flannel
//
// Flannel's FLANNEL-POSTRTG (iptables) returns only for pod-subnet-to-cluster
// and cluster-to-pod-subnet traffic; weft returns for any traffic between
// two addresses of N, so a packet between two other nodes' pods routed
// through this node is not translated either (Flannel masquerades it). The
// rest is Flannel's rule for rule. Flannel's nftables mode (EnableNFTables)
// matches the exact mark 0x4000 and returns for `saddr != S daddr N`, which
// makes its last masquerade rule unreachable; weft follows its iptables
// rules, the ones Flannel runs by default. Like Flannel, weft masquerades
// with fully-random ports unless Config.KeepPorts (flanneld's
// --ip-masq-fully-random-disable) asks for plain masquerade, which keeps a
// flow's source port when it is free; nftables always supports
// fully-random, so weft needs no check for it.
//
// On a node taken over from flanneld, package backend/forward removes
// Flannel's FLANNEL-POSTRTG chains and flannel-ipv4/flannel-ipv6 tables when
// weftd starts.
//
// # Why this way
//
// Masquerading rather than SNAT to a fixed address follows the outgoing
// interface's address; fully-random port selection avoids the source-port
// collisions that plain masquerade hits when many pods talk to one
// destination. Plain masquerade is for pods that need their port kept
// (NAT traversal, as Tailscale does from a pod). The table is replaced in one nftables transaction, so the
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
