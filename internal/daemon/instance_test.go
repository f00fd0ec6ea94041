package daemon

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// TestInstanceToken: the token is kept across weftd's restarts (the same
// boot), made anew after a reboot (another boot id) or when its file holds
// garbage, kept per subnet file, and still given when it cannot be kept.
func TestInstanceToken(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	path := filepath.Join(dir, "subnet.env.instance")
	token := func(path, boot string) string {
		t.Helper()
		tok, err := instanceToken(path, boot, log)
		if err != nil {
			t.Fatal(err)
		}
		if len(tok) != 32 {
			t.Fatalf("token %q, want 32 hex digits", tok)
		}
		return tok
	}
	first := token(path, "boot-1")
	if again := token(path, "boot-1"); again != first {
		t.Errorf("a restart in the same boot got %s, want the kept %s", again, first)
	}
	rebooted := token(path, "boot-2")
	if rebooted == first {
		t.Error("a reboot kept the token")
	}
	if again := token(path, "boot-2"); again != rebooted {
		t.Errorf("after the reboot the new token %s was not kept (got %s)", rebooted, again)
	}
	if other := token(filepath.Join(dir, "other.env.instance"), "boot-2"); other == rebooted {
		t.Error("another subnet file's weftd got the same token")
	}
	if err := os.WriteFile(path, []byte("boot-2 not-a-token\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := token(path, "boot-2"); got == rebooted || got == "not-a-token" {
		t.Errorf("a garbage token file gave %q", got)
	}
	// A path that cannot be written (its directory is a file): a token for
	// this process all the same.
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	token(filepath.Join(blocker, "subnet.env.instance"), "boot-2")
	if entries, _ := os.ReadDir(dir); len(entries) != 3 {
		t.Errorf("left %d files in %s, want the two token files and the blocker (no temporary files)", len(entries), dir)
	}
}
