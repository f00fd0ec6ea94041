package kernel

import "time"

// DefaultResync is the period of the full sync the backends run by
// default, as Calico's Felix refreshes its routes. Drift the kernel
// reports (a deleted or changed route, neighbour, FDB entry, address or
// device) is repaired on the notification, within about a second, and a
// lost subscription is followed by a full sync; the periodic one is for the
// state no notification covers, such as uvxlan's tc programs (WireGuard,
// whose peers change without a notification, syncs more often).
const DefaultResync = 90 * time.Second
