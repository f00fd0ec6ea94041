//go:build !race

package uvxlan

const raceEnabled = false
