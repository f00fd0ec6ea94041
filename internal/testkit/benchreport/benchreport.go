// Package benchreport writes a benchmark's report into the markdown file
// that WEFT_BENCH_REPORT names, between the markers of its section, and
// says which tree and command produced it.
package benchreport

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Path is the report file WEFT_BENCH_REPORT names, a relative path taken
// from the repository's root; "" when it names none.
func Path(root string) string {
	path := os.Getenv("WEFT_BENCH_REPORT")
	if path != "" && !filepath.IsAbs(path) {
		path = filepath.Join(root, path)
	}
	return path
}

// WriteSection puts text between the markers of bench's section name in
// path ("<!-- bench/<bench> <name> report: begin … -->" and its end).
func WriteSection(path, bench, name string, text []byte) error {
	begin := fmt.Sprintf("<!-- bench/%s %s report: begin (written by the benchmark; do not edit) -->", bench, name)
	end := fmt.Sprintf("<!-- bench/%s %s report: end -->", bench, name)
	old, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	i, j := bytes.Index(old, []byte(begin)), bytes.Index(old, []byte(end))
	if i < 0 || j < i {
		return fmt.Errorf("report: %s has no markers %q and %q", path, begin, end)
	}
	var out bytes.Buffer
	out.Write(old[:i+len(begin)])
	out.WriteString("\n\n")
	out.Write(text)
	out.WriteString("\n")
	out.Write(old[j:])
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// Commit is the tree's commit, with "+changes" when tracked files other
// than markdown and package docs differ from it: reports (this one, which an earlier
// section of the run may have written, and those of runs before it in the
// same tree) and docs change nothing a report measures.
func Commit(root string) string {
	status := append([]string{"-C", root, "status", "--porcelain", "--untracked-files=no", "--", "."}, notCode...)
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (no git)"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", status...).Output(); err != nil || len(bytes.TrimSpace(st)) > 0 {
		c += "+changes"
	}
	return c
}

// Command is the go test command line that runs the benchmark of pkg
// ("./bench/peers") as it runs now, with the WEFT_BENCH_ variables set.
func Command(pkg string) string {
	var parts []string
	for _, e := range os.Environ() {
		if strings.HasPrefix(e, "WEFT_BENCH_") {
			parts = append(parts, e)
		}
	}
	slices.Sort(parts)
	parts = append(parts, "go test -run '^$'")
	for _, f := range []string{"bench", "benchtime", "timeout"} {
		if fl := flag.Lookup("test." + f); fl != nil && fl.Value.String() != fl.DefValue {
			parts = append(parts, fmt.Sprintf("-%s '%s'", f, fl.Value.String()))
		}
	}
	return strings.Join(append(parts, pkg), " ")
}
