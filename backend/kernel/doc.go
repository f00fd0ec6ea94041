// Package kernel holds what several dataplanes program the same way in the
// node's kernel, over netlink.
//
//   - Overlay programs the routes and permanent neighbours towards the
//     peers' subnets on an overlay link (Gateway: a subnet's first address
//     stands for it on the link, as in Flannel), with a PeerStep between the
//     neighbour and the route (the vxlan backend's FDB entry). Sync makes
//     the link hold exactly a table, reading the kernel and repairing drift;
//     Apply and ApplyAt write only the rows a change touched.
//   - Desired hands the latest table, or its changed rows, from the lease
//     loop to a backend, and wakes its Reconciler: the repair loop that
//     syncs on a new table, on the kernel notifications OverlayDrift calls
//     drift (debounced), and every DefaultResync.
//   - FindUnderlay picks the underlay device in flanneld's order;
//     SetProcessNice runs the dataplane's threads at a nice value.
//
// The desired state and the plan are pure (overlay.go) and table-tested;
// the _linux files touch the kernel.
package kernel
