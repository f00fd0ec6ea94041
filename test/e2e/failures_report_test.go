package e2e

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/weft-net/weft/internal/testkit/benchreport"
)

// failureRow is one Flannel report of docs/flannel-failures.md: the text is
// fixed here, the figure is what the row's test records in this run.
type failureRow struct {
	ID      string // the key tests record under
	Report  string // the report(s), flannel-io/flannel unless named
	Users   string // what Flannel's users see
	Weft    string // what weft does
	Test    string // the test and what it brings about; "" when none
	Removed string // what was removed once to see the test fail, and how it failed
}

// flannelFailures are the rows, in the order of the issue that lists them.
var flannelFailures = []failureRow{
	{ID: "1070", Report: "#1070, #1759: routes lost after a network or interface restart",
		Users: "pods on the node cut off until flanneld restarts",
		Weft: "every dataplane watches the kernel's link, address, route and neighbour notifications and repairs what drifted; " +
			"host-gw treats any change of the underlay device or its addresses as drift (the kernel drops routes via a downed device without a notification). " +
			"When the address weftd took from the device (not one a flag or annotation chose) is replaced by another for 5 s, weftd moves its etcd lease " +
			"to the new address and starts the node again on it with the same subnet, in the same process",
		Test: "`TestFlannel1070UnderlayRestart` (vxlan and host-gw: link down 300 ms then up; address flushed and added again; address replaced by a new one)",
		Removed: "host-gw's drift rules for the underlay link and its addresses (`Link`/`Addr` always false), and the underlay address watch: " +
			"host-gw's three cases fail (routes not back within 10 s; weftd still running 5 s after its address was replaced)"},
	{ID: "2247", Report: "#2247, k3s-io/k3s#12436: the underlay device deleted and created again (tailscale0, ZeroTier, VLAN, bond)",
		Users: "pods on the node cut off until flanneld restarts",
		Weft: "weftd checks, on every link and address change the kernel notifies, that the underlay device is the one it started on; when a new device holds its name and an address " +
			"of each family the old one had, weftd starts the node again on it in the same process (moving the lease when the address changed), " +
			"and the dataplane is rebuilt on the new device",
		Test: "`TestFlannel2247UnderlayRecreated` (vxlan, uvxlan, uvxlan with its files kept by a service manager, and host-gw; the underlay veth deleted and a new one made, with the same address, then with a new one; " +
			"this kernel has no VLAN driver)",
		Removed: "the watch of a recreated device and the in-process restart: vxlan and host-gw fail with the same address, all three with a new one " +
			"(pods do not talk again within 20 s)"},
	{ID: "2554", Report: "#2554: stale routes to removed nodes",
		Users: "traffic black-holed to old addresses; a reused subnet unreachable",
		Weft: "the first sync after start is a full one: every route, neighbour and FDB entry weft owns that no lease asks for is removed; " +
			"at run time a deleted or expired lease removes its peer at once",
		Test:    "`TestFlannel2554StaleRoutes` (while weftd is down on n1 one lease is deleted and one expires; then one expires while it runs)",
		Removed: "the deletion of unwanted routes in `kernel.Overlay.Sync`: fails, n3's route still on n1 2 s after weftd started"},
	{ID: "2237", Report: "#2237: `FLANNEL-POSTRTG` flushed during a pod restart",
		Users: "all pods on the node lose egress",
		Weft: "the masquerade tables and the `WEFT-FWD` forward rules are checked after every nftables change the kernel notifies " +
			"(iptables-legacy's, of which it gives no notice, every `--iptables-resync` seconds, 5 by default) and rewritten whole when anything differs",
		Test: "`TestFlannel2237RulesFlushed` (`--iptables-resync=1`, FORWARD policy DROP; masquerade table flushed, deleted, its chain deleted, " +
			"`WEFT-FWD` flushed, `nft flush ruleset`; bound asserted: the interval plus 1 s)",
		Removed: "the masquerade table's repair after the first programming (`ensure` skips when programmed): all five cases fail"},
	{ID: "1531", Report: "#1531: a race leaves a peer's routes out",
		Users:   "one node unreachable from another",
		Weft:    "the watch starts at the revision right after the listing it follows (the one Acquire made, if nothing was written since), so no lease written between the two is missed; each batch hands the backend the whole peer table",
		Test:    "`TestFlannel1531StartRace` (50 nodes, vxlan, one etcd, every weftd started at the same moment; each node's routes, neighbours and FDB entries read through netlink every 50 ms and compared with the leases; then two nodes ping every peer's overlay address)",
		Removed: "the watch started at etcd's current revision instead of the one after its listing (`follow(ctx, 0)` in `subnet/etcd/watch.go`): fails: 18 of 50 nodes lacked 1 to 10 peers 45 s after the start"},
	{ID: "1060", Report: "#1060: \"link has incompatible addresses\" after a restart",
		Users: "flanneld crash loop",
		Weft: "a device with the wrong VNI, port or type is recreated; a compatible one is adopted and its MAC, MTU, addresses and state set right " +
			"(a foreign address removed); a device on weft's VNI and port under another name (`flannel.1`) is removed, with a log line",
		Test:    "`TestFlannel1060LeftoverDevice` (`weft.1` with a foreign address, a wrong MAC, a wrong VNI, a wrong port, down; `flannel.1` on VNI 1 port 8472)",
		Removed: "the recreation of an incompatible device (an error instead, as flanneld): \"wrong VNI\" fails, weftd never ready"},
	{ID: "954", Report: "#954, #875, #904, #1240: leases not freed, \"out of subnets\" under churn, exit on a revoked lease",
		Users:   "new nodes cannot join; a node drops off",
		Weft:    "a lease is an etcd key with an etcd lease of `--subnet-lease-ttl`, so a node that goes away frees its subnet when that runs out (as Flannel: no release on stop, so that a restarted node keeps its subnet and its peers their routes); acquisition picks among the free subnets and retries lost races. A running weftd whose lease is deleted or revoked sees it in its watch, takes the lease again (the same subnet if still free) and reprograms, without exiting. `weftctl leases` shows each lease's RENEWAL, `OVERDUE` once its node is late renewing it (`--stale` lists only those)",
		Test:    "`TestFlannel954SubnetChurn` (in-process: 300 nodes are 300 `Registry` values of the real lease code on a real etcd, not 300 weftd processes, which a 2-core machine cannot run; each has a fresh address, joins 10 ms after the one before and lives 0.3 s to 4.3 s, renewing at half the 4 s TTL, then stops without releasing; a node joins while fewer than 256 leases can be held, 256 /24s of a /16). `TestFlannel1240LeaseLost` (real weftd, 6 s TTL, etcd reached over the underlay: n1's lease key deleted; its etcd lease revoked; n1 cut off from etcd by nftables drops in its namespace until its lease expired, then the cut lifted; a pod on n1 pings one on n2 throughout). `TestFlannel954StaleLeaseShown` (real weftd and weftctl, 16 s TTL: weftd stopped on one of three nodes)",
		Removed: "`TestFlannel954SubnetChurn`: the etcd lease on a new lease key (`create` puts without `WithLease`, so keys never expire), fails: \"out of subnets\" for the last nodes, with as few as 115 other leases held; `TestFlannel1240LeaseLost`: weftd's re-acquisition (the lease loop returns on a lost lease, as flanneld exits), fails: the lease is never written again and weftd exits with \"lease lost\" (seen with the key deleted, and with the cut case run alone); `TestFlannel954StaleLeaseShown`: the overdue verdict (`inspect.Overdue` always false), fails: `--stale` lists no lease while n3's runs out (\"0 of 2 leases\" once it expired)"},
	{ID: "98", Report: "#98 (Vagrant): every node reports 10.0.2.15",
		Users: "nodes share one subnet, pods collide",
		Weft: "leases are found by public IP, as Flannel's are, so before taking one weftd (etcd mode) claims its public address under " +
			"`<prefix>/weft-presence/<address>`: a record naming the node (`--node-name`, else the host name) and its instance (a token " +
			"kept in `<subnet file>.instance` with the boot it was made in, so a restart keeps it and a reboot or a clone does not), on an etcd lease of 60 s " +
			"(`--presence-ttl`) that it keeps alive and leaves to expire when it stops. A node whose address another owner claims stays " +
			"not ready, leaves the lease alone and says why (log, `/readyz`, `weftctl doctor`); a restart of the owner takes it back at once; " +
			"a node that died stops renewing, so a machine that replaced it with its address takes its lease over within the TTL, as with " +
			"Flannel. A running node whose claim lapsed (etcd out of reach longer than the TTL) and was taken meanwhile stops its session " +
			"and waits. Kubernetes mode names each lease after its Node and needs none of this",
		Test: "`TestFlannel98SamePublicIP` (n1 and n2 with `--public-ip=10.0.2.15`; n1 restarted; then n1 killed)",
		Removed: "the refusal of an address another name holds (`claim` always puts): fails, n2 never refuses; " +
			"in subnet/etcd, `TestPresenceRefusesALiveNodesAddress` fails too, and without the keep-alive `TestPresenceClaimsAgainAfterALapse`; " +
			"without the session's watch of the claim, internal/daemon's `TestDaemonFollowsPresence` fails"},
	{ID: "841", Report: "#841: MTU wrong on jumbo-frame networks",
		Users:   "large packets black-holed",
		Weft:    "the overlay MTU (subnet file, `weft.1`, the pods' `eth0`) is the underlay's minus 50",
		Test:    "`TestFlannel841MTU` (underlay MTU 9001 and 1400, vxlan)",
		Removed: "the overlay MTU from the underlay (`vtep.OverlayMTU` fixed at 1450): both fail (9001: MTU 1450 and the boundary ping; 1400: weftd never ready)"},
	{ID: "2388", Report: "#2388, #1039: UDP 8472 dropped by a hypervisor or firewall; and the PMTU black hole (only large datagrams dropped)",
		Users:   "cross-node traffic gone, or only large packets (TCP bulk, TLS handshakes), and nothing says why",
		Weft:    "`weftctl doctor` probes each peer over the overlay, with small probes and a DF probe of the overlay MTU, and on the underlay when the overlay is silent: it fails the peer as \"UDP 8472 blocked\" (underlay answers, overlay silent) or \"MTU black hole\" (small probes answer, the DF one does not). `weftctl connectivity` sends DF probes of its route's MTU after the small ones on every pair and names each pair where only the small ones pass",
		Test:    "`TestFlannel2388PMTUBlackHole` (an nftables rule on the underlay switch drops UDP 8472, then only UDP 8472 datagrams longer than 1000 bytes, with no ICMP; doctor on n1; connectivity on both nodes at once)",
		Removed: "the DF probe in doctor (its result taken from the small probes), and, separately, the DF probes in `connectivity.MeasureFrom`: doctor: \"large datagrams dropped\" fails (the probe is ok, \"DF 1450 bytes ok\"); connectivity: exit 0 on both nodes with the black hole, not named"},
	{ID: "1317", Report: "#1317: nf_tables host vs iptables rules",
		Users:   "pods cannot leave the node",
		Weft:    "iptables FORWARD policy DROP (legacy or nft): weft's `WEFT-FWD` accepts the cluster network, pods pass. What weft's rules cannot override, since a packet must pass every base chain on a hook: a native nftables forward chain with policy drop, and input chains (native or iptables-nft) that drop the VXLAN port by policy or by a rule. `weftctl doctor`'s `firewall/forward` asks the kernel: it makes the node forward echo replies between the overlay and its pods (requests with a borrowed source) and traces them: a drop fails naming the table, chain and rule or policy, with the rules to insert; replies forwarded only by a rule on their conntrack state (as in the nftables case here) make it warn with the chain's policy drop as a suspect and the same fix (`TestForwardTrace` in internal/ops/doctor checks eight forward shapes against the pods' own pings); `firewall/input` asks the kernel (nftables' trace of the peers' replies to its probes) and names the table, chain and rule or policy that dropped them, with the accept to insert; where no reply came (both nodes drop the port), it warns with its suspects and their fix (`TestInputTrace` in internal/ops/doctor sends datagrams through firewalld, ufw, NixOS, RHEL and plain nft rulesets)",
		Test:    "`TestFlannel1317NFTablesHost` (six hosts: iptables-legacy FORWARD DROP; iptables-nft FORWARD DROP; iptables-nft INPUT DROP; nftables `inet filter` forward policy drop; input policy drop; a rule `udp dport 8472 drop`)",
		Removed: "the `firewall/input` check (not run); then its recognition of an accepting rule; then weft's forward rules (`--iptables-forward-rules=false`): the three input cases fail (no check); \"nftables input policy drop\" fails (doctor still fails after the fix); both FORWARD DROP cases fail (pods do not reach each other); then firewall/forward's test of the rules a forwarded reply met (conntrack state, protocol): \"nftables forward policy drop\" fails (doctor says ok)"},
	{ID: "1421", Report: "#1421, k3s-io/k3s#5216, #1963: WireGuard stale or duplicate peers, \"file exists\" errors",
		Users:   "handshakes to dead peers, noisy logs",
		Weft:    "the WireGuard device's peers are compared with the leases on every change and every resync: a peer per lease, keyed by its public key; a deleted or expired lease, or a changed key, removes the old peer",
		Test:    "`TestFlannel1421WireGuardPeers` (3 nodes; 2 join; one leaves with its lease deleted, one with its lease expired; one restarts with a new key; two restart with theirs. Peers read from weftd's \"peer set\"/\"peer removed\" lines and, with a 1 s keepalive, from the underlay)",
		Removed: "the removal of stale peers in the wireguard backend's sync; then also the log-based peer comparison in the test: \"n4 left\" fails (n1's peers still hold n4's key); with the log comparison off, the wire check fails both departures (\"n1 sends WireGuard to … 192.168.77.4.51820 …\")"},
	{ID: "k3s5101", Report: "k3s-io/k3s#5101: WireGuard MTU regression",
		Users:   "large packets lost",
		Weft:    "the WireGuard overlay MTU (subnet file, `flannel-wg`, the pods' `eth0`) is the underlay's minus 80, Flannel's overhead (IPv6 outer header, so one MTU fits both families)",
		Test:    "`TestFlannelK3s5101WireGuardMTU` (underlay MTU 9001 and 1400, wireguard)",
		Removed: "the WireGuard MTU from the underlay (fixed at 1500 − 80): both MTUs fail (9001: MTU 1420 and the boundary ping; 1400: MTU 1420, and a 1321-byte DF ping crosses instead of failing in the pod)"},
	{ID: "849", Report: "#849: hairpin through a Service",
		Users: "timeouts",
		Weft:  "the bridge port of each pod is in hairpin mode (kube-flannel's conflist, weft's own)",
		Test: "`TestServicesKubeProxy` (test/e2e/service_test.go): a pod reaches itself through its own Service, with a real kube-proxy in iptables and nftables modes, " +
			"on vxlan, uvxlan (with and without the fast path), host-gw, WireGuard and a mixed pair",
		Removed: "hairpin mode on the pod's bridge port: the hairpin path fails in every case"},
}

var (
	failuresMu      sync.Mutex
	failuresFigures = map[string][]string{}
)

// recordFailure adds a figure to the row id of docs/flannel-failures.md.
func recordFailure(t *testing.T, id, figure string) {
	t.Helper()
	found := false
	for _, r := range flannelFailures {
		found = found || r.ID == id
	}
	if !found {
		t.Fatalf("recordFailure: no row %q in flannelFailures", id)
	}
	t.Logf("%s: %s", id, figure)
	failuresMu.Lock()
	failuresFigures[id] = append(failuresFigures[id], figure)
	failuresMu.Unlock()
}

// writeFailuresReport writes docs/flannel-failures.md (path) from this run's
// figures. Every row with a test must have recorded one: a report written
// from a partial run would present old claims as measured.
func writeFailuresReport(path string) error {
	failuresMu.Lock()
	defer failuresMu.Unlock()
	var missing []string
	for _, r := range flannelFailures {
		if r.Test != "" && len(failuresFigures[r.ID]) == 0 {
			missing = append(missing, r.ID)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("flannel failures report: no figure recorded for rows %s (run every test the report names, and none may fail)", strings.Join(missing, ", "))
	}
	var b strings.Builder
	b.WriteString("# Flannel's known failures, and what weft does about each\n\n")
	b.WriteString("Written by the test suite (do not edit by hand; the rows' text is in\n")
	b.WriteString("[test/e2e/failures_report_test.go](../test/e2e/failures_report_test.go)).\n")
	b.WriteString("Flannel's issue tracker lists the faults its users hit in production. Each\n")
	b.WriteString("row below is one of them, brought about on real kernels (every host in a\n")
	b.WriteString("network namespace of the test's own), a real etcd and the real `weftd`,\n")
	b.WriteString("`weftctl` and CNI plugin binaries, by a test in [test/e2e](../test/e2e)\n")
	b.WriteString("named after the report. The tests run with every `test/run.sh`. Pings are\n")
	b.WriteString("every 10 ms from a pod on one node to a pod on another; \"lost\" counts the\n")
	b.WriteString("requests never answered.\n\n")
	root, err := benchreport.Root()
	if err != nil {
		return err
	}
	st := benchreport.NewStamp(root, "flannel-failures",
		"WEFT_FAILURES_REPORT=$PWD/docs/flannel-failures.md go test -count=1 -run 'TestFlannel|TestServicesKubeProxy' ./test/e2e/",
		"cmd/weftd", "cmd/weftctl", "cmd/weft", "internal/daemon", "internal/ops", "subnet", "backend", "plugin", "vtep")
	stamp, err := st.Markdown(root)
	if err != nil {
		return err
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(&b, "%s\n%d cores, load average at the end %s. Command:\n\n    %s\n\n",
		stamp, runtime.NumCPU(), strings.Join(strings.Fields(string(load))[:3], " "), st.Command)
	b.WriteString("(with the environment `test/run.sh` exports).\n\n")
	b.WriteString("| Flannel report (flannel-io/flannel unless named) | what Flannel users see | what weft does | test | figure |\n|---|---|---|---|---|\n")
	for _, r := range flannelFailures {
		test, figure := r.Test, strings.Join(failuresFigures[r.ID], "; ")
		if test == "" {
			test, figure = "not yet tested", "—"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.Report, r.Users, r.Weft, test, figure)
	}
	b.WriteString("\n## Each test fails without the behaviour it checks\n\n")
	b.WriteString("Checked once per row by breaking the code, running the test, and restoring it:\n\n")
	b.WriteString("| report | what was removed, and what failed |\n|---|---|\n")
	for _, r := range flannelFailures {
		if r.Test != "" {
			fmt.Fprintf(&b, "| %s | %s |\n", strings.SplitN(r.Report, ":", 2)[0], r.Removed)
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
