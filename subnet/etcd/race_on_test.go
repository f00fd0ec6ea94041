//go:build race

package etcd

// raceEnabled: the race detector slows the in-process etcd several times
// over (a renewal took 3–4 s in TestFlannel954SubnetChurn), so that test
// gives its leases a longer TTL.
const raceEnabled = true
