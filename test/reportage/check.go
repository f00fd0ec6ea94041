package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/weft-net/weft/internal/testkit/benchreport"
)

// reports are the generated reports; each must carry a stamp.
var reports = []string{
	"bench/dataplane/README.md", "bench/peers/README.md", "bench/policy/README.md", "bench/cni/REPORT.md",
	"bench/fleet/README.md", "bench/size/README.md", "docs/reliability.md", "docs/flannel-failures.md", "docs/migration-report.md",
}

// figureRows are the pages whose table rows give figures from reports:
// in docs/performance.md every row, in the README a row with a figure.
var figureRows = map[string]*regexp.Regexp{
	"docs/performance.md": regexp.MustCompile(``),
	"README.md":           regexp.MustCompile(`\d\s*(Gb/s|Gbit/s|Mb/s|ms|µs|s|MB|KB|%|×|minutes)\b`),
}

// goalsExempt are benchmarks whose goals are rows that carry their own
// verdict.
var goalsExempt = map[string]string{
	"bench/faults": "every row of docs/reliability.md has a goal and a pass column, and the test fails a missed goal",
}

// check is every report without a stamp, figure row without a marker, and
// benchmark goal without a verdict.
func check(root string) []error {
	var errs []error
	for _, f := range reports {
		text, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, sections(f, string(text))...)
	}
	for f, figure := range figureRows {
		text, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		header := true
		for i, l := range strings.Split(string(text), "\n") {
			switch {
			case !strings.HasPrefix(l, "|"):
				header = true
			case header || strings.HasPrefix(l, "|---"):
				header = false
			case figure.MatchString(l) && !marker.MatchString(l):
				errs = append(errs, fmt.Errorf("%s:%d: a figure row names no report: add <!-- age <report>#<id> --> (then go run ./test/reportage -w)", f, i+1))
			}
		}
	}
	return append(errs, goals(root)...)
}

// sections is an error for a report f without a stamp, and for each of its
// benchmark sections ("report: begin" … "report: end") without one.
func sections(f, text string) []error {
	ss, err := benchreport.Stamps([]byte(text))
	if err != nil {
		return []error{fmt.Errorf("%s: %w", f, err)}
	}
	if len(ss) == 0 {
		return []error{fmt.Errorf("%s: a report without a stamp line (benchreport.Stamp): its commit is not recorded", f)}
	}
	var errs []error
	for _, part := range strings.Split(text, "report: begin")[1:] {
		body, _, _ := strings.Cut(part, "report: end")
		if !strings.Contains(body, "<!-- weft-report ") {
			errs = append(errs, fmt.Errorf("%s: section %.60q has no stamp line", f, body))
		}
	}
	return errs
}

var goalWord = regexp.MustCompile(`(?i)\bgoals?\b`)

// goals is an error for each string in a benchmark's Go source that names
// a goal: a benchmark names goals only in benchreport.Goal values, which
// benchreport.Verdicts prints each with a verdict, met or not.
func goals(root string) []error {
	var errs []error
	pkgs := map[string]string{} // dir → its sources
	err := filepath.WalkDir(filepath.Join(root, "bench"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		dir := filepath.Dir(rel)
		if _, ok := goalsExempt[dir]; ok {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, 0)
		if err != nil {
			return err
		}
		src, _ := os.ReadFile(p)
		pkgs[dir] += string(src)
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING && goalWord.MatchString(lit.Value) {
				errs = append(errs, fmt.Errorf("%s: the string %.60s names a goal: declare it as a benchreport.Goal and print it with benchreport.Verdicts", rel, lit.Value))
			}
			return true
		})
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	for dir, src := range pkgs {
		if strings.Contains(src, "benchreport.Goal{") && !strings.Contains(src, "benchreport.Verdicts(") {
			errs = append(errs, fmt.Errorf("%s: declares goals and prints no verdicts (benchreport.Verdicts)", dir))
		}
	}
	return errs
}
