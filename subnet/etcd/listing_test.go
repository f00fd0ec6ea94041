package etcd

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// TestAcquireKeepsListing checks what Acquire leaves for the next Watch
// against a real etcd: every lease, its own new one folded in at the
// revision etcd gave it, and nothing once another writer came in between.
func TestAcquireKeepsListing(t *testing.T) {
	t.Parallel()
	env := newEnv(t, netConf)
	ctx := testCtx(t)
	other := env.registry(Options{TTL: 60 * time.Second})
	for i := range 3 {
		if _, err := other.Acquire(ctx, attrs(t, fmt.Sprintf("10.0.0.%d", 10+i)), netip.Prefix{}); err != nil {
			t.Fatal(err)
		}
	}
	own, err := env.reg.Acquire(ctx, attrs(t, "10.0.0.1"), netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	entries, rev, ok := env.reg.kept.take()
	if !ok || rev != own.Revision || len(entries) != 4 {
		t.Fatalf("kept listing: ok=%v rev=%d (lease at %d) %d entries, want 4 at the lease's revision", ok, rev, own.Revision, len(entries))
	}
	for i, e := range entries {
		if i > 0 && entries[i-1].name >= e.name {
			t.Errorf("entries not sorted by name: %s before %s", entries[i-1].name, e.name)
		}
		if e.name == own.Key() && (e.lease.Attrs.PublicIP != own.Attrs.PublicIP || e.lease.Revision != own.Revision || e.leaseID == 0) {
			t.Errorf("own entry %+v, want the lease %+v with its etcd lease", e, own)
		}
	}
	want, _, err := env.reg.list(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if want[i].name != entries[i].name || !sameValue(want[i].value, entries[i].value) || want[i].leaseID != entries[i].leaseID {
			t.Errorf("kept entry %d: %s %q %x, a new listing has %s %q %x", i, entries[i].name, entries[i].value,
				entries[i].leaseID, want[i].name, want[i].value, want[i].leaseID)
		}
	}
	if _, _, ok := env.reg.kept.take(); ok {
		t.Error("the listing was handed out twice")
	}
}

// TestListingDroppedOnGap: a write that is not the very next revision means
// someone else wrote in between, so the listing is no state at one revision.
func TestListingDroppedOnGap(t *testing.T) {
	var l listing
	l.keep([]entry{{name: "10.244.1.0-24"}}, 10)
	l.wrote(entry{name: "10.244.0.0-24"}, 11)
	entries, rev, ok := l.take()
	if !ok || rev != 11 || len(entries) != 2 || entries[0].name != "10.244.0.0-24" {
		t.Fatalf("after the next revision: %v %d %v", ok, rev, entries)
	}
	l.keep([]entry{{name: "10.244.1.0-24"}}, 10)
	l.wrote(entry{name: "10.244.1.0-24"}, 12)
	if _, _, ok := l.take(); ok {
		t.Error("a listing with a gap before our write was kept")
	}
	l.keep([]entry{{name: "10.244.1.0-24"}}, 10)
	l.at = time.Now().Add(-listingMaxAge - time.Second)
	if _, _, ok := l.take(); ok {
		t.Error("a listing older than listingMaxAge was handed out")
	}
}
