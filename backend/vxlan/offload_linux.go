package vxlan

import (
	"fmt"
	"regexp"
	"strconv"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/safchain/ethtool"
	"golang.org/x/sys/unix"
)

// txChecksumFeature is the ethtool feature of a VXLAN device's transmit
// checksum offload (NETIF_F_HW_CSUM).
const txChecksumFeature = "tx-checksum-ip-generic"

// Kernels before 5.7 send packets that were NATed (kube-proxy's Service
// traffic, masquerade with --random-fully) through a VXLAN device with a bad
// checksum while the device's transmit checksum offload is on; the receiver
// drops them and TCP stalls for 1 s or 63 s (flannel-io/flannel#1279,
// kubernetes/kubernetes#88986). 5.7 carries the fix.
const fixedMajor, fixedMinor = 5, 7

var releaseRE = regexp.MustCompile(`^(\d+)\.(\d+)`)

// checksumBug reports whether release (as uname -r gives it) is a kernel
// older than 5.7.
func checksumBug(release string) (bool, error) {
	m := releaseRE.FindStringSubmatch(release)
	if m == nil {
		return false, fmt.Errorf("kernel release %q: not <major>.<minor>", release)
	}
	major, err := strconv.Atoi(m[1])
	if err != nil {
		return false, fmt.Errorf("kernel release %q: %w", release, err)
	}
	minor, err := strconv.Atoi(m[2])
	if err != nil {
		return false, fmt.Errorf("kernel release %q: %w", release, err)
	}
	return major < fixedMajor || major == fixedMajor && minor < fixedMinor, nil
}

// kernelRelease is the running kernel's release (uname -r).
func kernelRelease() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}

// disableTxChecksum turns the transmit checksum offload of device name off
// where it is on, in the namespace at netns (empty: this process's). It
// reports whether it changed anything.
func disableTxChecksum(netns, name string) (bool, error) {
	var e *ethtool.Ethtool
	open := func() (err error) { e, err = ethtool.NewEthtool(); return err }
	var err error
	if netns == "" {
		err = open()
	} else { // the ioctl socket acts on the namespace it was opened in
		err = ns.WithNetNSPath(netns, func(ns.NetNS) error { return open() })
	}
	if err != nil {
		return false, fmt.Errorf("ethtool socket: %w", err)
	}
	defer e.Close()
	feats, err := e.Features(name)
	if err != nil {
		return false, fmt.Errorf("read offload features of %s: %w", name, err)
	}
	on, ok := feats[txChecksumFeature]
	if !ok {
		return false, fmt.Errorf("%s has no %s feature", name, txChecksumFeature)
	}
	if !on {
		return false, nil
	}
	if err := e.Change(name, map[string]bool{txChecksumFeature: false}); err != nil {
		return false, fmt.Errorf("turn %s off on %s: %w", txChecksumFeature, name, err)
	}
	return true, nil
}
