package benchreport

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteSection: the text replaces what was between the section's
// markers and nothing else; a file without them is an error.
func TestWriteSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "README.md")
	doc := "intro\n<!-- bench/x a report: begin (written by the benchmark; do not edit) -->\nold\n<!-- bench/x a report: end -->\nafter\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteSection(path, "x", "a", []byte("new")); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	want := strings.Replace(doc, "\nold\n", "\n\nnew\n", 1)
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if err := WriteSection(path, "x", "b", []byte("new")); err == nil || !strings.Contains(err.Error(), "no markers") {
		t.Errorf("a section without markers: %v", err)
	}
}
