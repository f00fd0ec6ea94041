package subnet

import (
	"fmt"
	"net"
)

// MAC is an Ethernet address. It is comparable, so it can sit in map values
// and be compared with ==, unlike net.HardwareAddr.
type MAC [6]byte

// ParseMAC parses a 48-bit MAC in any form net.ParseMAC accepts.
func ParseMAC(s string) (MAC, error) {
	hw, err := net.ParseMAC(s)
	if err != nil {
		return MAC{}, fmt.Errorf("parse mac %q: %w", s, err)
	}
	if len(hw) != 6 {
		return MAC{}, fmt.Errorf("parse mac %q: not a 48-bit address", s)
	}
	return MAC(hw), nil
}

// HardwareAddr returns m as a net.HardwareAddr (a fresh slice).
func (m MAC) HardwareAddr() net.HardwareAddr { return net.HardwareAddr(m[:]) }

// IsZero reports whether m is 00:00:00:00:00:00.
func (m MAC) IsZero() bool { return m == MAC{} }

func (m MAC) String() string { return m.HardwareAddr().String() }

// MarshalText implements encoding.TextMarshaler ("4e:fb:7d:bf:6b:2d").
func (m MAC) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *MAC) UnmarshalText(b []byte) error {
	v, err := ParseMAC(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}
