package deps

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRaceSkips checks the tests that test/run.sh's pass under the race
// detector skips by name (its norace list): -skip applies to every package
// of the pass, so each name must be one test function of the module, no
// more (a test of the same name elsewhere would lose its race run) and no
// fewer (a renamed test would quietly run again).
func TestRaceSkips(t *testing.T) {
	b, err := os.ReadFile("../run.sh")
	if err != nil {
		t.Fatal(err)
	}
	_, list, ok := strings.Cut(string(b), "\nnorace=(\n")
	if list, _, ok = strings.Cut(list, "\n)\n"); !ok {
		t.Fatal("test/run.sh has no norace=( … ) list")
	}
	var patterns []string
	for _, l := range strings.Split(list, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if len(l) < 2 || l[0] != '\'' || l[len(l)-1] != '\'' {
			t.Fatalf("norace entry %s: want one single-quoted pattern a line", l)
		}
		patterns = append(patterns, l[1:len(l)-1])
	}
	if _, err := regexp.Compile(strings.Join(patterns, "|")); err != nil {
		t.Fatalf("the -skip pattern: %v", err)
	}

	declared := map[string][]string{} // test function → files declaring it
	decl := regexp.MustCompile(`(?m)^func (Test\w*)\(`)
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "vendor"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, "_test.go"):
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			declared[m[1]] = append(declared[m[1]], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	name := regexp.MustCompile(`Test\w*`)
	count := 0
	for _, p := range patterns {
		parts := strings.Split(p, "/") // the top-level test, then its subtests
		for _, part := range parts {
			// Unanchored, a name would skip every test whose name holds it.
			if !strings.HasPrefix(part, "^") || !strings.HasSuffix(part, "$") {
				t.Errorf("norace entry %q: each part must be anchored, ^…$", p)
			}
		}
		for _, n := range name.FindAllString(parts[0], -1) {
			count++
			switch files := declared[n]; len(files) {
			case 1:
				// A subtest named in the list must be one the test runs.
				if len(parts) == 1 {
					break
				}
				src, err := os.ReadFile(files[0])
				if err != nil {
					t.Fatal(err)
				}
				for _, part := range parts[1:] {
					for _, sub := range alternatives(part) {
						if !strings.Contains(string(src), `"`+strings.ReplaceAll(sub, "_", " ")+`"`) {
							t.Errorf("test/run.sh skips %s/%s under -race, but %s names no such subtest", n, sub, files[0])
						}
					}
				}
			case 0:
				t.Errorf("test/run.sh skips %s under -race, but no test of that name is declared", n)
			default:
				t.Errorf("test/run.sh skips %s under -race, declared %d times (%s): -skip would skip them all", n, len(files), strings.Join(files, ", "))
			}
		}
	}
	if count == 0 {
		t.Error("test/run.sh's norace list names no test")
	}
}

// alternatives returns the names of an anchored part, ^name$ or
// ^(a|b|…)$.
func alternatives(part string) []string {
	part = strings.TrimSuffix(strings.TrimPrefix(part, "^"), "$")
	part = strings.TrimSuffix(strings.TrimPrefix(part, "("), ")")
	return strings.Split(part, "|")
}
