// Package flows measures what reading conntrack's events for weftd's
// flows costs a node under a flood of new connections: the reader's CPU
// and memory, and the connection rate the node sustains with it, against
// the same flood with no reader, in interleaved rounds. See README.md.
package flows
