// SPDX-License-Identifier: Apache-2.0
//
// The uvxlan fast path: three tc programs, on the TAP's egress, on the
// underlay device's ingress and on the pod bridge's egress, and the maps
// they share with weftd (backend/uvxlan/fastpath_linux.go). Per-node values are volatile const
// variables that weftd sets at load; the peers are in the maps.
//
// Anything a program does not fully check it passes on unchanged
// (TC_ACT_UNSPEC): to the next tcx program or else the kernel's usual
// path, the TAP queue or the UDP socket of the userspace path, which
// applies every rule and counts every drop.
//
// Regenerate the committed objects with `go generate ./backend/uvxlan/...`
// (see README.md here).

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define TC_ACT_UNSPEC (-1)
#define TC_ACT_SHOT 2

#define ETH_P_IP 0x0800
#define PACKET_HOST 0
#define IPPROTO_UDP 17
#define VXLAN_FLAG_I 0x08

#define ETH_HLEN 14
#define IPV4_HLEN 20
#define UDP_HLEN 8
#define VXLAN_HLEN 8
#define TCP_HLEN_MIN 20

// What VXLAN over IPv4 puts in front of the inner frame after the outer
// Ethernet header: IPv4, UDP, VXLAN and the inner Ethernet header.
#define ENCAP_LEN (IPV4_HLEN + UDP_HLEN + VXLAN_HLEN + ETH_HLEN)

// Set by weftd at load (progParams in fastpath_linux.go).
volatile const __u8 local_addr[4];  // our IPv4 underlay address
volatile const __u32 vni;           // our VNI
volatile const __u16 port;          // the VXLAN UDP port
volatile const __u8 vtep_mac[6];    // our VTEP MAC (the TAP's)
volatile const __u32 mtu;           // the overlay MTU
volatile const __u32 tap_ifindex;   // the TAP
volatile const __u32 underlay_ifindex; // the device that holds local_addr

// Counter slots of the per-CPU stats array's one element (fastTxFrames…
// in fastpath_linux.go).
enum {
	FAST_TX_FRAMES,
	FAST_TX_BYTES,
	FAST_RX_FRAMES,
	FAST_RX_BYTES,
	FAST_ERRORS,  // a frame dropped after its headers were changed
	FAST_DEMOTED, // rx entries handed to the userspace path for good
	FAST_BRIDGE_PASSED, // super-packets sent to a bridge port past the bridge
	NUM_FAST_COUNTERS,
};

// Values of the rx map.
enum {
	RX_FAST = 1,      // the peer's packets take the fast path
	RX_USERSPACE = 2, // set here: they all take the userspace path
};

// The maps' size. Peers beyond it (more than a /16 cut into /24s has, many
// times over) take the userspace path.
#define MAX_FAST_PEERS (1 << 16)

// VTEP MAC, zero padded → the peer's IPv4 underlay address.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(key_size, 8);
	__uint(value_size, 4);
	__uint(max_entries, MAX_FAST_PEERS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} weft_fp_tx SEC(".maps");

// LPM trie key: the prefix length in bits, then the peer's underlay
// address and the inner source, in network order.
struct rx_key {
	__u32 bits;
	__u8 outer[4];
	__u8 inner[4];
};

// (peer underlay address, inner source prefix) → RX_FAST or RX_USERSPACE.
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(key_size, sizeof(struct rx_key));
	__uint(value_size, 4);
	__uint(max_entries, MAX_FAST_PEERS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} weft_fp_rx SEC(".maps");

// The pods' MACs, zero padded → the index of the pod bridge's port that
// holds each: the bridge's forwarding database, as weftd reads it
// (bridge_linux.go). A MAC not in the map goes through the bridge.
#define MAX_BRIDGE_PORTS 4096

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(key_size, 8);
	__uint(value_size, 4);
	__uint(max_entries, MAX_BRIDGE_PORTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} weft_fp_ports SEC(".maps");

struct counters {
	__u64 v[NUM_FAST_COUNTERS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(key_size, 4);
	__uint(value_size, sizeof(struct counters));
	__uint(max_entries, 1);
} weft_fp_stats SEC(".maps");

// Headers, in wire order. Own definitions rather than linux/ip.h's, whose
// bit fields follow the byte order of the machine that compiles.
struct eth {
	__u8 dst[6];
	__u8 src[6];
	__be16 proto;
};

struct ipv4 {
	__u8 ver_ihl;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__u16 check;
	__u8 saddr[4];
	__u8 daddr[4];
};

struct udp {
	__be16 source;
	__be16 dest;
	__be16 len;
	__u16 check;
};

struct vxlan {
	__be32 flags;
	__be32 vni;
};

// What the egress program puts in front of the frame, and the frame's own
// Ethernet header behind it. pad keeps the IPv4 header 4-byte aligned.
struct encap {
	__u16 pad;
	struct eth eth;
	struct ipv4 ip;
	struct udp udp;
	struct vxlan vx;
	struct eth inner;
};

// The first bytes of a VXLAN packet, up to the inner IPv4 header's end
// (read as bytes: it is not aligned).
struct decap {
	__u16 pad;
	struct eth eth;
	struct ipv4 ip;
	struct udp udp;
	struct vxlan vx;
	struct eth inner;
	__u8 iip[IPV4_HLEN];
};

static __always_inline void count(int slot, __u64 bytes)
{
	__u32 key = 0;
	struct counters *c = bpf_map_lookup_elem(&weft_fp_stats, &key);

	if (!c)
		return;
	c->v[slot]++;
	if (bytes)
		c->v[slot + 1] += bytes;
}

// The folded 16-bit sum of a 20-byte IPv4 header: 0xffff for one whose
// checksum is correct.
static __always_inline __u32 ipv4_sum(struct ipv4 *ip)
{
	__u64 s = bpf_csum_diff(0, 0, (void *)ip, IPV4_HLEN, 0);

	s = (s & 0xffff) + ((s >> 16) & 0xffff);
	s = (s & 0xffff) + (s >> 16);
	return s;
}

// The egress program runs on the TAP's egress, before the frame would be
// queued for the userspace path: an IPv4 frame whose destination MAC is a
// peer's VTEP MAC (the tx map) is encapsulated in place, RFC 7348 over
// UDP, and sent out of the underlay device through the kernel's neighbour
// table. A TSO super-frame stays one: the kernel segments it as it does
// its own VXLAN's, or hands it across a virtual link whole.
SEC("tc")
int weft_fp_egress(struct __sk_buff *skb)
{
	struct encap h = {};
	__u8 key[8] = {};
	__u32 len, *peer, sport;
	int i;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_UNSPEC;
	len = skb->len;
	if (len > 0xffff - (IPV4_HLEN + UDP_HLEN + VXLAN_HLEN))
		return TC_ACT_UNSPEC; // the outer length must fit
	// The frame's Ethernet header becomes the inner one.
	if (bpf_skb_load_bytes(skb, 0, &h.inner, ETH_HLEN))
		return TC_ACT_UNSPEC;
	// tx[destination MAC] is the peer's underlay address.
	for (i = 0; i < 6; i++)
		key[i] = h.inner.dst[i];
	peer = bpf_map_lookup_elem(&weft_fp_tx, key);
	if (!peer)
		return TC_ACT_UNSPEC;
	__builtin_memcpy(h.ip.daddr, peer, 4);
	// Source port from the inner flow's hash, in 32768–60999 as the
	// kernel's VXLAN picks it.
	sport = (((__u64)bpf_get_hash_recalc(skb) * (60999 - 32768 + 1)) >> 32) + 32768;
	// Room for the headers, marked as a UDP tunnel with an Ethernet inner
	// frame so that GSO segments it as VXLAN; the MSS stays.
	if (bpf_skb_adjust_room(skb, ENCAP_LEN, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 |
					BPF_F_ADJ_ROOM_ENCAP_L4_UDP |
					BPF_F_ADJ_ROOM_ENCAP_L2_ETH |
					BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN)))
		return TC_ACT_UNSPEC; // unchanged on failure
	// Outer Ethernet: the MACs are filled in by the neighbour output.
	h.eth.proto = bpf_htons(ETH_P_IP);
	// Outer IPv4: no DF and a random ID, as the kernel's VXLAN by
	// default; TTL 64.
	h.ip.ver_ihl = 0x45;
	h.ip.tot_len = bpf_htons(len + IPV4_HLEN + UDP_HLEN + VXLAN_HLEN);
	h.ip.id = bpf_get_prandom_u32();
	h.ip.ttl = 64;
	h.ip.protocol = IPPROTO_UDP;
	for (i = 0; i < 4; i++)
		h.ip.saddr[i] = local_addr[i];
	// UDP, checksum 0 as the kernel's VXLAN sends it over IPv4.
	h.udp.source = bpf_htons(sport);
	h.udp.dest = bpf_htons(port);
	h.udp.len = bpf_htons(len + UDP_HLEN + VXLAN_HLEN);
	// VXLAN: the I flag and our VNI.
	h.vx.flags = bpf_htonl(VXLAN_FLAG_I << 24);
	h.vx.vni = bpf_htonl(vni << 8);
	h.ip.check = ipv4_sum(&h.ip) ^ 0xffff;
	if (bpf_skb_store_bytes(skb, 0, &h.eth, ETH_HLEN + ENCAP_LEN, 0)) {
		count(FAST_ERRORS, 0); // half changed: it cannot be handed on
		return TC_ACT_SHOT;
	}
	count(FAST_TX_FRAMES, len);
	return bpf_redirect_neigh(underlay_ifindex, 0, 0, 0);
}

// The ingress program runs on the underlay device's ingress, before the
// packet reaches the UDP socket: a VXLAN packet for us from a peer, whose
// inner IPv4 source is inside that peer's subnets (the rx map), is
// decapsulated in place and handed to the TAP's receive path, as if the
// userspace path had written it. Everything else goes on to the socket
// unchanged: packets for other hosts or VLANs, with IP options, fragments
// or a bad header checksum, other VNIs, flags or MACs, inner frames that
// are not IPv4 or too big, from foreign sources, and skbs whose lengths do
// not match one datagram. An skb that holds several (a super-packet of UDP
// datagrams: a peer without the fast path sends with UDP GSO, which a
// virtual link carries whole) can only be taken apart by the userspace
// path; from then on that peer's packets all go there (its rx entry says
// so), so that none of its flows' single datagrams overtakes a
// super-packet queued there. The outer UDP checksum is not checked: the
// inner packet's own are, by the receiving stack.
SEC("tc")
int weft_fp_ingress(struct __sk_buff *skb)
{
	struct decap h;
	struct rx_key key;
	__u32 hlen, ilen, ulen, olen, gso, *rx;
	int i;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_UNSPEC;
	if (skb->pkt_type != PACKET_HOST)
		return TC_ACT_UNSPEC;
	if (skb->vlan_present)
		return TC_ACT_UNSPEC; // a tagged frame is its VLAN device's
	if (bpf_skb_load_bytes(skb, 0, &h.eth, ETH_HLEN + ENCAP_LEN + IPV4_HLEN))
		return TC_ACT_UNSPEC;
	// Outer IPv4 without options or fragmentation, UDP, to us.
	if (h.ip.ver_ihl != 0x45)
		return TC_ACT_UNSPEC;
	if (h.ip.protocol != IPPROTO_UDP)
		return TC_ACT_UNSPEC;
	if (h.ip.frag_off & bpf_htons(0x3fff))
		return TC_ACT_UNSPEC;
	for (i = 0; i < 4; i++)
		if (h.ip.daddr[i] != local_addr[i])
			return TC_ACT_UNSPEC;
	if (h.udp.dest != bpf_htons(port))
		return TC_ACT_UNSPEC;
	// VXLAN: exactly the I flag, our VNI.
	if (h.vx.flags != bpf_htonl(VXLAN_FLAG_I << 24))
		return TC_ACT_UNSPEC;
	if (h.vx.vni != bpf_htonl(vni << 8))
		return TC_ACT_UNSPEC;
	// Inner Ethernet to our VTEP MAC, carrying IPv4 with a consistent
	// header.
	for (i = 0; i < 6; i++)
		if (h.inner.dst[i] != vtep_mac[i])
			return TC_ACT_UNSPEC;
	if (h.inner.proto != bpf_htons(ETH_P_IP))
		return TC_ACT_UNSPEC;
	if (h.iip[0] >> 4 != 4)
		return TC_ACT_UNSPEC;
	hlen = h.iip[0] & 0x0f;
	if (hlen < 5)
		return TC_ACT_UNSPEC;
	hlen *= 4;
	ilen = (__u32)h.iip[2] << 8 | h.iip[3];
	if (ilen < hlen)
		return TC_ACT_UNSPEC;
	// The outer IPv4 header checksum, as ip_rcv checks it.
	if (ipv4_sum(&h.ip) != 0xffff)
		return TC_ACT_UNSPEC;
	// rx[outer source, inner source]: a peer's, and inside its subnets;
	// its value says whether the peer's packets take the fast path.
	key.bits = 64;
	for (i = 0; i < 4; i++) {
		key.outer[i] = h.ip.saddr[i];
		key.inner[i] = h.iip[12 + i];
	}
	rx = bpf_map_lookup_elem(&weft_fp_rx, &key);
	if (!rx || *rx != RX_FAST)
		return TC_ACT_UNSPEC;
	// One datagram, whose lengths agree: UDP = inner IPv4 + 30, outer
	// IPv4 = UDP + 20, skb = outer IPv4 + 14. A super-packet whose do not
	// holds several datagrams.
	gso = skb->gso_size;
	ulen = bpf_ntohs(h.udp.len);
	olen = bpf_ntohs(h.ip.tot_len);
	if (ulen != ilen + UDP_HLEN + VXLAN_HLEN + ETH_HLEN || olen != ulen + IPV4_HLEN ||
	    skb->len != olen + ETH_HLEN) {
		// A single packet (padded, or odd) just goes on; a super-packet
		// hands its peer to the userspace path, counted once by
		// whichever CPU swapped the value.
		if (gso && __sync_lock_test_and_set(rx, RX_USERSPACE) == RX_FAST)
			count(FAST_DEMOTED, 0);
		return TC_ACT_UNSPEC;
	}
	// Within the MTU: the packet, or for a super-packet its segments (an
	// MSS that leaves room for the IPv4 and TCP headers).
	if (!gso && ilen > mtu)
		return TC_ACT_UNSPEC;
	if (gso && gso > mtu - IPV4_HLEN - TCP_HLEN_MIN)
		return TC_ACT_UNSPEC;
	// Take off outer IPv4, UDP, VXLAN and the inner Ethernet header (the
	// MSS stays), then put the inner MACs where the outer were.
	if (bpf_skb_adjust_room(skb, -ENCAP_LEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO))
		return TC_ACT_UNSPEC; // unchanged on failure
	if (bpf_skb_store_bytes(skb, 0, &h.inner, ETH_HLEN, 0)) {
		count(FAST_ERRORS, 0);
		return TC_ACT_SHOT;
	}
	count(FAST_RX_FRAMES, skb->len);
	return bpf_redirect(tap_ifindex, BPF_F_INGRESS);
}

// The bridge program runs on the pod bridge's egress, where the node sends
// a packet it routed to one of its pods: a super-packet (GSO) that came in
// through the TAP, for a MAC the bridge learned on one of its ports, goes
// straight to that port, as the bridge would forward it; everything else
// (the host's own packets among them) goes through the bridge.
// The reason is the ingress program's super-packets. They still carry the
// tunnel's GSO marks, which bpf_skb_adjust_room has no flag to clear (Linux
// 6.18 has none), and a bridge offers no segmentation offload for
// tunnelled packets, so it would cut each into segments in software; a
// veth takes them whole. The node's routing and its forward rules
// (NetworkPolicy among them) have judged the packet already.
SEC("tc")
int weft_fp_bridge(struct __sk_buff *skb)
{
	__u8 key[8] = {};
	__u32 *port;

	if (!skb->gso_size || skb->ingress_ifindex != tap_ifindex)
		return TC_ACT_UNSPEC;
	if (bpf_skb_load_bytes(skb, 0, key, 6))
		return TC_ACT_UNSPEC;
	if (key[0] & 1)
		return TC_ACT_UNSPEC; // a group address is the bridge's to flood
	port = bpf_map_lookup_elem(&weft_fp_ports, key);
	if (!port)
		return TC_ACT_UNSPEC;
	count(FAST_BRIDGE_PASSED, 0);
	return bpf_redirect(*port, 0);
}

char __license[] SEC("license") = "Apache-2.0";
