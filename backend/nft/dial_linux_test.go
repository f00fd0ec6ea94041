package nft

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestDialOwnNamespaceWithoutSysAdmin: weftd's container has CAP_NET_ADMIN
// but not CAP_SYS_ADMIN, which entering a namespace takes; a path naming
// the caller's own namespace (as the forward rules' watch passes one) must
// be dialed without entering it. The test runs itself again without
// CAP_SYS_ADMIN (setpriv drops it from the bounding set) and subscribes
// there as WatchTables does.
func TestDialOwnNamespaceWithoutSysAdmin(t *testing.T) {
	if os.Getenv("WEFT_NFT_NO_SYS_ADMIN") == "1" {
		if err := dialOwnNamespace(); err != nil {
			t.Fatal(err)
		}
		return
	}
	nettest.RequireRoot(t)
	cmd := exec.Command("setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin", "--",
		os.Args[0], "-test.run", "^TestDialOwnNamespaceWithoutSysAdmin$", "-test.count", "1")
	cmd.Env = append(os.Environ(), "WEFT_NFT_NO_SYS_ADMIN=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("without CAP_SYS_ADMIN: %v\n%s", err, out)
	}
}

func dialOwnNamespace() error {
	var c unix.CapUserData
	if err := unix.Capget(&unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}, &c); err != nil {
		return err
	}
	if c.Effective&(1<<unix.CAP_SYS_ADMIN) != 0 {
		return fmt.Errorf("still has CAP_SYS_ADMIN")
	}
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	conn, done, err := dial(fmt.Sprintf("/proc/self/fd/%d", fd), nftables.AsLasting())
	if err != nil {
		return err
	}
	defer done()
	defer conn.CloseLasting()
	_, err = conn.ListTables()
	return err
}
