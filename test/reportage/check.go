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
	"slices"
	"strings"

	"github.com/weft-net/weft/internal/testkit/benchreport"
)

// reports are the generated reports; each must carry a stamp, as must any
// page with a benchmark's section ("report: begin").
var reports = []string{
	"bench/dataplane/README.md", "bench/dataplane/PEER-FILTER.md", "bench/peers/README.md", "bench/policy/README.md", "bench/cni/REPORT.md",
	"bench/fleet/README.md", "bench/size/README.md", "bench/flows/README.md", "docs/reliability.md", "docs/flannel-failures.md",
	"docs/migration-report.md", "docs/network-policy.md", "docs/conformance.md",
}

// figure is a number with a measured unit: what makes a table row a
// figure row (seconds are left out: they are also configuration defaults).
var figure = regexp.MustCompile(`\d\s*(Gb/s|Gbit/s|Mb/s|ms|µs|MB|KB|%|×)\b`)

// figurePages are the pages whose tables give figures copied from
// reports: the README and docs/*.md; in docs/performance.md every row is a
// figure row.
func figurePages(root string) ([]string, error) {
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	out := []string{"README.md"}
	for _, p := range pages {
		out = append(out, "docs/"+filepath.Base(p))
	}
	return out, nil
}

// goalsExempt are the packages that may name goals in strings: those that
// print verdicts, and bench/faults, whose rows carry their own.
var goalsExempt = map[string]string{
	"bench/faults":                 "every row of docs/reliability.md has a goal and a pass column, and the test fails a missed goal",
	"internal/testkit/benchreport": "prints the verdicts",
	"test/reportage":               "checks them",
}

// check is every report without a stamp, figure row without a marker, and
// benchmark goal without a verdict.
func check(root string) []error {
	files, err := markdown(root)
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, f := range files {
		text, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if slices.Contains(reports, f) || strings.Contains(string(text), "report: begin") {
			errs = append(errs, sections(f, string(text))...)
		}
	}
	for _, f := range reports {
		if !slices.Contains(files, f) {
			errs = append(errs, fmt.Errorf("%s: a report is missing", f))
		}
	}
	pages, err := figurePages(root)
	if err != nil {
		errs = append(errs, err)
	}
	for _, f := range pages {
		text, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if slices.Contains(reports, f) && !strings.Contains(string(text), "report: begin") {
			continue // a whole page of report: its tables are its figures
		}
		errs = append(errs, rows(f, string(text))...)
	}
	return append(errs, goals(root)...)
}

// rows is an error for each figure row of page f that names no report:
// a row names one with an age marker, or the table does, on the last
// non-blank line before it. Tables inside a report's own section are its
// figures.
func rows(f, text string) []error {
	var errs []error
	prev, header, covered, inReport := "", true, false, false
	for i, l := range strings.Split(text, "\n") {
		switch {
		case strings.Contains(l, "report: begin"):
			inReport = true
		case strings.Contains(l, "report: end"):
			inReport = false
		case !strings.HasPrefix(l, "|"):
			header = true
		case header:
			header, covered = false, marker.MatchString(prev)
		case inReport || covered || strings.HasPrefix(l, "|---") || marker.MatchString(l):
		case f == "docs/performance.md" || figure.MatchString(l):
			errs = append(errs, fmt.Errorf("%s:%d: a figure row names no report: add <!-- age <report>#<id> --> to it or above its table (then go run ./test/reportage -w)", f, i+1))
		}
		if strings.TrimSpace(l) != "" {
			prev = l
		}
	}
	return errs
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

// goals is an error for each string in the module's Go source (the
// benchmarks' and the report writers') that names a goal: goals are named
// only in benchreport.Goal values, which benchreport.Verdicts prints each
// with a verdict, met or not.
func goals(root string) []error {
	var errs []error
	pkgs := map[string]string{} // dir → its sources
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && p != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
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
