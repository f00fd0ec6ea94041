package benchreport

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// gitRepo is a repository in a temporary directory with a/x and b/y
// committed, and the short name of that commit.
func gitRepo(t *testing.T) (dir, first string) {
	dir = t.TempDir()
	for _, f := range []string{"a/x", "b/y"} {
		write(t, dir, f, "1")
	}
	git(t, dir, "init", "-q")
	git(t, dir, "add", ".")
	commit(t, dir)
	return dir, git(t, dir, "rev-parse", "--short", "HEAD")
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func commit(t *testing.T, dir string) {
	git(t, dir, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "c")
}

func write(t *testing.T, dir, f, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, f), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestAge: the note names the measured paths changed since the stamp's
// commit, uncommitted changes included; changes
// elsewhere, to tests and to markdown do not count; a commit outside the history, a path without
// files and a shallow clone are errors.
func TestAge(t *testing.T) {
	dir, first := gitRepo(t)
	s := Stamp{ID: "r", Commit: first + "+changes", Date: "d", Measures: []string{"a"}, Command: "c"}
	age := func() string {
		t.Helper()
		a, err := Age(dir, s)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	head := "Measured at " + first + "+changes, d; "
	if got, want := age(), head+"nothing it measures changed since."; got != want {
		t.Errorf("at its commit: %q, want %q", got, want)
	}
	write(t, dir, "b/y", "2")
	commit(t, dir)
	if got, want := age(), head+"nothing it measures changed since."; got != want {
		t.Errorf("after a change elsewhere: %q, want %q", got, want)
	}
	write(t, dir, "a/x_test.go", "1")
	write(t, dir, "a/README.md", "1")
	write(t, dir, "a/doc.go", "// Package a.\npackage a\n")
	git(t, dir, "add", ".")
	commit(t, dir)
	if got, want := age(), head+"nothing it measures changed since."; got != want {
		t.Errorf("after a test, a README and a package doc added to a: %q, want %q", got, want)
	}
	write(t, dir, "a/nodoc.go", "package a\n")
	git(t, dir, "add", ".")
	if got, want := age(), head+"since then these measured paths changed: a."; got != want {
		t.Errorf("with a/nodoc.go added: %q, want %q", got, want)
	}
	git(t, dir, "rm", "-q", "--cached", "a/nodoc.go")
	write(t, dir, "a/x", "2")
	commit(t, dir)
	if got, want := age(), head+"since then these measured paths changed: a."; got != want {
		t.Errorf("after a commit to a: %q, want %q", got, want)
	}
	s.Commit = strings.TrimSpace(git(t, dir, "rev-parse", "HEAD"))
	head = "Measured at " + s.Commit + ", d; "
	write(t, dir, "a/x", "3")
	if got, want := age(), head+"since then these measured paths changed: a."; got != want {
		t.Errorf("with an uncommitted change to a: %q, want %q", got, want)
	}
	for _, c := range []struct {
		s    Stamp
		want string
	}{
		{Stamp{ID: "r", Commit: "0000000", Measures: []string{"a"}}, "not in this clone's history"},
		{Stamp{ID: "r", Commit: first, Measures: []string{"c"}}, `measured path "c" has no files`},
	} {
		if _, err := Age(dir, c.s); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %s", c.s, err, c.want)
		}
	}
	shallow := filepath.Join(t.TempDir(), "s")
	git(t, dir, "clone", "-q", "--depth", "1", "file://"+dir, shallow)
	if _, err := Age(shallow, s); err == nil || !strings.Contains(err.Error(), "shallow clone") {
		t.Errorf("in a shallow clone: %v, want an error saying so", err)
	}
}

// TestDocFilesHoldNoCode: every doc.go of the repository holds a package
// comment and clause only, so that Age and Commit may leave them out.
func TestDocFilesHoldNoCode(t *testing.T) {
	root := strings.TrimSpace(git(t, ".", "rev-parse", "--show-toplevel"))
	n := 0
	for _, f := range strings.Fields(git(t, root, "ls-files", "doc.go", "*/doc.go")) {
		file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, f), nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if len(file.Decls) > 0 || file.Doc == nil {
			t.Errorf("%s: %d declarations, package comment %v: a doc.go holds the package's comment and clause only", f, len(file.Decls), file.Doc != nil)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no doc.go found")
	}
}

// TestStampLine: a stamp reads back as written, even with "-->" in its
// command; a stamp missing a field is an error, also when a writer makes
// one.
func TestStampLine(t *testing.T) {
	s := Stamp{ID: "x", Commit: "abc+changes", Date: "2026-12-06 14:30 UTC", Measures: []string{"a", "b/c"}, Command: "go test -run '^$' --> x"}
	got, ok, err := ParseStamp(s.Line())
	if !ok || err != nil || got.Command != s.Command || strings.Join(got.Measures, ",") != "a,b/c" || got.Commit != s.Commit {
		t.Errorf("ParseStamp(%s) = %+v, %v, %v", s.Line(), got, ok, err)
	}
	s.Commit = ""
	if _, ok, err := ParseStamp(s.Line()); !ok || err == nil {
		t.Errorf("a stamp without its commit: %v, %v", ok, err)
	}
	s.Commit, s.Measures = "abc", nil
	if _, err := s.Markdown(t.TempDir()); err == nil || !strings.Contains(err.Error(), "measures") {
		t.Errorf("a new stamp without measured paths: %v", err)
	}
}

// TestVerdicts: every goal gets a line, met, not met or not measured, with
// the figure over the bound.
func TestVerdicts(t *testing.T) {
	goals := []Goal{
		{Name: "start", AtMost: true, Bound: 0.4, Unit: "s"},
		{Name: "faster", Bound: 15, Unit: "×"},
		{Name: "p99", AtMost: true, Bound: 50, Unit: "ms"},
	}
	got := Verdicts(goals, map[string]float64{"start": 1.28, "faster": 30})
	if v := (Goal{Name: "p50", AtMost: true, Bound: 10, Unit: "ms"}).Verdict(1234.4); v != "goal: p50 ≤ 10 ms: 1234 ms, 123.44× the bound: not met" {
		t.Errorf("a large figure: %s", v)
	}
	want := []string{
		"goal: start ≤ 0.4 s: 1.28 s, 3.20× the bound: not met",
		"goal: faster ≥ 15 ×: 30.0 ×, 2.00× the bound: met",
		"goal: p99 ≤ 50 ms: not measured",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestCommitChanges: a stamp's commit says "+changes" for uncommitted
// changes to any tracked file but markdown (reports and docs).
func TestCommitChanges(t *testing.T) {
	dir, first := gitRepo(t)
	write(t, dir, "r.md", "report")
	write(t, dir, "a/doc.go", "// Package a.\npackage a\n")
	git(t, dir, "add", "r.md", "a/doc.go")
	commit(t, dir)
	head := git(t, dir, "rev-parse", "--short", "HEAD")
	if c := Commit(dir); c != head || c == first {
		t.Fatalf("clean tree: %q, want %q", c, head)
	}
	write(t, dir, "docs/n.md", "doc")
	git(t, dir, "add", "docs/n.md")
	commit(t, dir)
	head = git(t, dir, "rev-parse", "--short", "HEAD")
	write(t, dir, "r.md", "another report")
	write(t, dir, "docs/n.md", "another doc")
	write(t, dir, "a/doc.go", "// Package a does more.\npackage a\n")
	if c := Commit(dir); c != head {
		t.Errorf("changed reports: %q, want %q", c, head)
	}
	write(t, dir, "a/x", "2")
	if c := Commit(dir); c != head+"+changes" {
		t.Errorf("changed code: %q, want %q", c, head+"+changes")
	}
}
