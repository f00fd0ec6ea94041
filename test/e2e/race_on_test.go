//go:build race

package e2e

// raceEnabled: the race detector checks the tests' own code only (the
// binaries they run are built without it), so the long matrices run a
// short variant.
const raceEnabled = true
