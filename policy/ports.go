package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
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

// storeProblem is what the error of PortsFromStore means for the source
// checks. A store that does not exist while no running pod has an address
// in the node's subnets is none: the CNI plugin creates it with the first
// pod's address, so every new node starts without one. With such a pod, a
// missing store is a problem (its path is not the plugin's).
func storeProblem(err error, pods []*corev1.Pod, locals ...netip.Prefix) error {
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, p := range pods {
		if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ips := []string{p.Status.PodIP}
		for _, ip := range p.Status.PodIPs {
			ips = append(ips, ip.IP)
		}
		for _, ip := range ips {
			a, perr := netip.ParseAddr(ip)
			for _, l := range locals {
				if perr == nil && l.IsValid() && l.Contains(a) {
					return err
				}
			}
		}
	}
	return nil
}
