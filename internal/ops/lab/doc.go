// Package lab builds a complete weft overlay on one machine, inside network
// namespaces that it creates and always removes: an underlay switch, N node
// namespaces each running the real weftd against an embedded etcd reached
// over a unix socket, and M pods per node wired by the real weft CNI plugin
// through libcni, as a container runtime does.
//
// # Layout
//
// Everything a lab owns is found from its state directory (default
// /run/weft-lab):
//
//	<state>/lock               flock held by the `lab up` process for its whole life
//	<state>/lab.json           what was built: namespaces, PIDs, pods and their addresses
//	<state>/etcd.sock, data/   the embedded etcd
//	<state>/nodes/<node>/      subnet.env, weftd.log, CNI data and cache
//
// Namespaces are named Prefix(stateDir) + "sw", "node<i>", "node<i>-pod<j>".
// The prefix is "weftlab-" for the default state directory and
// "weftlab-<hash>-" for any other one, so two labs with different state
// directories (a user's and a test's) never share a name, and debris of a
// dead lab is exactly the set of namespaces that match its own prefix.
//
// # Lifecycle
//
// Up runs in the foreground: it holds the lock and the embedded etcd,
// supervises the weftd processes and tears everything down when its context
// ends (Ctrl-C, SIGTERM from Down). A second Up on the same state directory
// refuses while the lock is held; when the lock is free but lab.json or
// namespaces remain (the first one was killed), it removes that debris
// first: recorded processes are signalled only after their start time and
// command line prove they are still the ones the lab started.
package lab
