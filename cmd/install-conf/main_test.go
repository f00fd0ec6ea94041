package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestInstall(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "cni-conf.json")
	dest := filepath.Join(dir, "net.d", "10-flannel.conflist")
	os.Mkdir(filepath.Dir(dest), 0o755)
	os.WriteFile(src, []byte(`{"name":"cbr0"}`), 0o644)
	os.WriteFile(dest, []byte("old"), 0o644)
	if err := run([]string{src, dest}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(dest)
	if string(b) != `{"name":"cbr0"}` {
		t.Errorf("dest holds %q", b)
	}
	if ents, _ := os.ReadDir(filepath.Dir(dest)); len(ents) != 1 {
		t.Errorf("leftovers beside dest: %v", ents)
	}
	if err := run([]string{src}); err == nil {
		t.Error("one argument accepted")
	}
	if err := run([]string{filepath.Join(dir, "missing"), dest}); err == nil {
		t.Error("missing source accepted")
	}
}
