//go:build race

package uvxlan

// raceEnabled: the race detector slows the packet loops about tenfold, so
// the end-to-end tests move less data.
const raceEnabled = true
