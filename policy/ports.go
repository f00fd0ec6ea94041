package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// PodPort is a pod address and the node's bridge port (the host end of
// the pod's veth) that the address belongs to.
type PodPort struct {
	Addr netip.Addr
	Port string
}

// PortsFromStore reads the address store that weft's CNI plugin shares with
// host-local (dir is <ipam.dataDir>/<network name>: one file per reserved
// address, named by it, holding "containerID\r\nifname") and returns each
// address with its host veth as the plugin names it: "veth" and the first
// 11 hex digits of the SHA-256 of that content. Files not named by an
// address (the lock, last_reserved_ip.N) are skipped. A pod wired by
// another plugin has a veth of another name: its entry matches no port.
func PortsFromStore(dir string) ([]PodPort, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("address store: %w", err)
	}
	var out []PodPort
	for _, e := range ents {
		a, err := netip.ParseAddr(e.Name())
		if err != nil || !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // released meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("address store: %w", err)
		}
		key := strings.TrimSpace(string(b))
		if key == "" {
			continue
		}
		sum := sha256.Sum256([]byte(key))
		out = append(out, PodPort{Addr: a, Port: "veth" + hex.EncodeToString(sum[:6])[:11]})
	}
	slices.SortFunc(out, func(a, b PodPort) int { return a.Addr.Compare(b.Addr) })
	return out, nil
}
