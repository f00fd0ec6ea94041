// Package web serves a live page of the overlay for `weftctl web` and
// `weftctl lab up --web`: the nodes with their lease, underlay address and
// dataplane, each node's pods on its bridge, the links between nodes with
// the dataplane's frame and byte rates, drift repairs and rejected leases as
// they happen, and a packet's path between two addresses as `weftctl
// explain` reads it, with the pod ends (eth0, veth, bridge) around it, and
// a flows panel: the latest flows weftd keeps on the nodes (Server.Flows),
// each drop with the policies behind it, drawn between its pods.
//
// A Source reads the overlay: the leases from etcd or the Kubernetes API,
// each observed node's kernel (inspect.ReadKernel, inspect.Compare) and its
// weftd's /metrics. Nothing is written. The Server pushes a Snapshot to the
// page as server-sent events every interval and answers path questions; the
// page is plain HTML, CSS and JavaScript embedded in the binary, with a
// Content-Security-Policy that allows only them. The server listens on
// loopback unless told otherwise (CheckListen).
package web
