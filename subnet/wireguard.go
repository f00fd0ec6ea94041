package subnet

import (
	"encoding/base64"
	"fmt"
	"strings"
)

// WireGuardData is the BackendData (and BackendV6Data) of a wireguard
// lease, as Flannel writes it: {"PublicKey":"<base64>","Port":51820}.
type WireGuardData struct {
	PublicKey string
	Port      uint16
}

// parseWireGuard fills the wireguard fields of b from raw, with Flannel's
// defaults, and checks them.
func parseWireGuard(b BackendConfig, raw *rawBackend) (BackendConfig, error) {
	b.ListenPort, b.ListenPortV6 = DefaultWireGuardPort, DefaultWireGuardPortV6
	if raw.ListenPort != 0 {
		b.ListenPort = raw.ListenPort
	}
	if raw.ListenPortV6 != 0 {
		b.ListenPortV6 = raw.ListenPortV6
	}
	for name, p := range map[string]int{"ListenPort": b.ListenPort, "ListenPortV6": b.ListenPortV6} {
		if p < 1 || p > 65535 {
			return b, fmt.Errorf("Backend.%s %d: must be between 1 and 65535", name, p)
		}
	}
	b.Mode = strings.ToLower(raw.Mode)
	switch b.Mode {
	case "":
		b.Mode = WireGuardSeparate
	case WireGuardSeparate, WireGuardAuto, WireGuardIPv4, WireGuardIPv6:
	default:
		return b, fmt.Errorf("Backend.Mode %q: must be %q, %q, %q or %q", raw.Mode, WireGuardSeparate, WireGuardAuto, WireGuardIPv4, WireGuardIPv6)
	}
	if raw.PersistentKeepaliveInterval < 0 || raw.PersistentKeepaliveInterval > 65535 {
		return b, fmt.Errorf("Backend.PersistentKeepaliveInterval %d: must be between 0 and 65535 seconds", raw.PersistentKeepaliveInterval)
	}
	b.PersistentKeepaliveInterval = raw.PersistentKeepaliveInterval
	if raw.PSK != "" {
		if k, err := base64.StdEncoding.DecodeString(raw.PSK); err != nil || len(k) != 32 {
			return b, fmt.Errorf("Backend.PSK: not a WireGuard key (32 bytes in base64, as `wg genpsk` prints)")
		}
	}
	b.PSK = raw.PSK
	return b, nil
}

// checkWireGuardData checks the backend data of one family of a wireguard
// lease: a public key (32 bytes in base64) and a port (0 means the same as
// ours, as Flannel reads it).
func checkWireGuardData(typ string, d *WireGuardData) error {
	if typ != BackendTypeWireGuard {
		return nil
	}
	if d == nil {
		return fmt.Errorf("missing")
	}
	if k, err := base64.StdEncoding.DecodeString(d.PublicKey); err != nil || len(k) != 32 {
		return fmt.Errorf("PublicKey %q: not a WireGuard key", d.PublicKey)
	}
	return nil
}
