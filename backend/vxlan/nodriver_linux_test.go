package vxlan

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestNoDriverIsTheKernelsAnswer: a link kind the kernel has no driver for
// (no module of that name to load) is refused with the error Create
// reports as ErrNoDriver, so the fallback sees what a kernel without the
// vxlan module says.
func TestNoDriverIsTheKernelsAnswer(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n := newNode(t, u, 1)
	la := netlink.NewLinkAttrs()
	la.Name = "weftnodrv0"
	err := n.Handle.LinkAdd(&netlink.GenericLink{LinkAttrs: la, LinkType: "weftnodriver"})
	if err == nil {
		t.Fatal("the kernel made a device of an unknown kind")
	}
	if !errors.Is(noDriver(err), ErrNoDriver) {
		t.Errorf("the kernel's answer for a kind without a driver, %v, is not taken for ErrNoDriver", err)
	}
}

// TestCreateNoDriver: Create reports ErrNoDriver when device creation fails
// as on a kernel without the vxlan module, other errors as they are, and
// with a working kernel makes the devices and leaves them down for Run.
func TestCreateNoDriver(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n := newNode(t, u, 1)
	for _, tc := range []struct {
		name     string
		err      error
		noDriver bool
	}{
		{"no driver", unix.EOPNOTSUPP, true},
		{"no privilege", unix.EPERM, false},
		{"bad attributes", unix.EINVAL, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := n.config()
			c.AddLink = func(netlink.Link) error { return tc.err }
			err := newBackend(t, c).Create()
			if !errors.Is(err, tc.err) || errors.Is(err, ErrNoDriver) != tc.noDriver {
				t.Errorf("Create: %v (want %v, ErrNoDriver %v)", err, tc.err, tc.noDriver)
			}
		})
	}
	if err := newBackend(t, n.config()).Create(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"weft.1", "weft-v6.1"} {
		l, err := n.Handle.LinkByName(name)
		if err != nil {
			t.Fatalf("Create made no %s: %v", name, err)
		}
		if _, ok := l.(*netlink.Vxlan); !ok || l.Attrs().RawFlags&unix.IFF_UP != 0 {
			t.Errorf("%s: %s, flags %#x; want a VXLAN device, down", name, l.Type(), l.Attrs().RawFlags)
		}
	}
}
