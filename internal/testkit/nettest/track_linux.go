package nettest

import "testing"

// TrackConnections makes the kernel track the connections of namespace n,
// as kube-proxy's rules do on a node: a table of the test's own (inet
// wefttest-track) with a rule on the forward hook that matches conntrack
// state. Without a user, the kernel tracks nothing, and a conntrack reader
// gets no event. The table goes with the namespace.
func TrackConnections(tb testing.TB, n Runner) {
	tb.Helper()
	MustRun(tb, n, "nft", "add table inet wefttest-track")
	MustRun(tb, n, "nft", "add chain inet wefttest-track forward { type filter hook forward priority 0 ; }")
	MustRun(tb, n, "nft", "add rule inet wefttest-track forward ct state new counter")
}
