package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// Forwarding sysctls of the node's network namespace.
const (
	forwardIPv4 = "/proc/sys/net/ipv4/ip_forward"
	forwardIPv6 = "/proc/sys/net/ipv6/conf/all/forwarding"
)

// enableForwarding turns on forwarding of one family, which a node needs to
// carry container traffic between its bridge and the overlay; it writes only
// when forwarding is off, and logs it.
//
// weftd does this for IPv4 as it starts, before it writes the subnet file:
// dockerd sets the iptables FORWARD policy to DROP when it has to turn
// forwarding on itself, which drops every connection that other hosts'
// containers open to its containers; when forwarding is already on, it
// leaves the policy alone. IPv6 forwarding is turned on only for a
// dual-stack lease, as it changes how the host treats router advertisements.
func enableForwarding(path string, log *slog.Logger) error {
	b, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("enable forwarding (%s): %w", path, err)
	}
	log.Info("turned on forwarding", "sysctl", path)
	return nil
}
