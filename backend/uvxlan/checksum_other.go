//go:build !amd64

package uvxlan

const haveSum32 = false

func sum32([]byte) uint64 { panic("uvxlan: no vector checksum on this architecture") }
