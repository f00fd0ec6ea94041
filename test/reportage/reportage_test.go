package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/testkit/benchreport"
)

// TestReportsKnowTheirAge: every report has its stamp, every figure row of
// docs/performance.md and the README names its report, every benchmark
// goal is printed with a verdict, and every age note is what git says now
// (the fix for a stale one: go run ./test/reportage -w).
func TestReportsKnowTheirAge(t *testing.T) {
	root, err := benchreport.Root()
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range check(root) {
		t.Error(err)
	}
	docs, err := update(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if !bytes.Equal(d.old, d.new) {
			t.Errorf("%s: its age notes are stale (run go run ./test/reportage -w):\n%s", d.path, firstDiff(d.old, d.new))
		}
	}
}

// firstDiff is the first line where a and b differ, as it is and as it
// should be.
func firstDiff(a, b []byte) string {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return "  is:        " + al[i] + "\n  should be: " + bl[i]
		}
	}
	return "  (lines added or removed at the end)"
}

// TestNotes: the line after a stamp becomes its note (added when missing),
// and a row's marker is followed by the note up to the end of its cell,
// the rest of the row kept.
func TestNotes(t *testing.T) {
	age := func(key string) (string, error) { return "Measured at " + key + ".", nil }
	in := `<!-- weft-report {"id":"s","commit":"c","date":"d","measures":["a"],"command":"x"} -->
Measured at old.
text
<!-- weft-report {"id":"t","commit":"c","date":"d","measures":["a"],"command":"x"} -->
| row | [r](r.md): ` + "`cmd`" + ` <!-- age r.md#s --> measured at old | last <!-- age r.md#t --> |`
	want := `<!-- weft-report {"id":"s","commit":"c","date":"d","measures":["a"],"command":"x"} -->
Measured at f.md#s.
text
<!-- weft-report {"id":"t","commit":"c","date":"d","measures":["a"],"command":"x"} -->
Measured at f.md#t.
| row | [r](r.md): ` + "`cmd`" + ` <!-- age r.md#s --> measured at r.md#s. | last <!-- age r.md#t --> |`
	got, err := notes("f.md", []byte(in), age)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestCheckFinds: a report section without a stamp, a figure row whose
// table names no report and a benchmark string that names a goal are
// reported.
func TestCheckFinds(t *testing.T) {
	errs := sections("r.md", "<!-- bench/x a report: begin -->\nfigures\n<!-- bench/x a report: end -->\n"+
		`<!-- weft-report {"id":"s","commit":"c","date":"d","measures":["a"],"command":"x"} -->`)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "has no stamp line") {
		t.Errorf("a section without a stamp: %v", errs)
	}
	if errs := sections("r.md", "no stamp"); len(errs) != 1 || !strings.Contains(errs[0].Error(), "without a stamp line") {
		t.Errorf("a report without a stamp: %v", errs)
	}
	table := "\n\n| what | figure |\n|---|---|\n| a | 5 ms |\n"
	if errs := rows("docs/x.md", "text"+table); len(errs) != 1 || !strings.Contains(errs[0].Error(), "docs/x.md:5: a figure row names no report") {
		t.Errorf("a figure row without a marker: %v", errs)
	}
	if errs := rows("docs/x.md", "<!-- age r.md#s -->"+table); len(errs) != 0 {
		t.Errorf("a table with a marker above it: %v", errs)
	}
	if errs := rows("docs/x.md", "<!-- age r.md#s -->"+table+table); len(errs) != 1 {
		t.Errorf("a second table below one with a marker: %v", errs)
	}
	root := t.TempDir()
	src := "package x\n\nimport \"fmt\"\n\nfunc f() { fmt.Println(\"Goals: p50 ≤ 10 ms\") }\n"
	if err := os.MkdirAll(filepath.Join(root, "bench/x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bench/x/x.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if errs := goals(root); len(errs) != 1 || !strings.Contains(errs[0].Error(), "names a goal") {
		t.Errorf("a goal named in a string: %v", errs)
	}
}
