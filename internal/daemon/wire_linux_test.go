package daemon

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/weft-net/weft/subnet"
)

// TestExtensionLeaseData: an extension node's lease carries what its
// PreStartupCommand printed as BackendData, as flanneld writes it; a failing
// command stops the daemon before it leases anything.
func TestExtensionLeaseData(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"extension","PreStartupCommand":"echo 4e:fb:7d:bf:6b:2d"}}`))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := subnet.LeaseAttrs{BackendType: subnet.BackendTypeExtension}
	if err := leaseData(context.Background(), subnet.BackendTypeExtension, cfg, &a, log); err != nil {
		t.Fatal(err)
	}
	if a.ExtensionData != `"4e:fb:7d:bf:6b:2d"` {
		t.Errorf("lease data %s", a.ExtensionData)
	}
	cfg.Backend.PreStartupCommand = "exit 2"
	if err := leaseData(context.Background(), subnet.BackendTypeExtension, cfg, &a, log); err == nil {
		t.Error("a failing PreStartupCommand gave no error")
	}
}
