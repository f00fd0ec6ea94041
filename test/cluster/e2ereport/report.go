package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// ginkgoReport is the part of a Ginkgo v2 JSON report (types.Report) read
// here. e2e.test writes an array of them.
type ginkgoReport struct {
	SuiteDescription           string
	SuiteSucceeded             bool
	SpecialSuiteFailureReasons []string
	StartTime                  time.Time
	EndTime                    time.Time
	RunTime                    time.Duration
	SpecReports                []specReport
}

type specReport struct {
	ContainerHierarchyTexts []string
	LeafNodeType            string
	LeafNodeText            string
	State                   string
	RunTime                 time.Duration
	Failure                 *struct{ Message string }
}

// name is the spec's full name as e2e.test's --ginkgo.focus matches it.
func (s specReport) name() string {
	return strings.Join(append(append([]string(nil), s.ContainerHierarchyTexts...), s.LeafNodeText), " ")
}

// readSpecs reads a Ginkgo JSON report and returns its specs (It nodes only,
// not the suite's setup nodes) by full name, and the report itself.
func readSpecs(path string) (map[string]specReport, []ginkgoReport, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var reports []ginkgoReport
	if err := json.Unmarshal(b, &reports); err != nil {
		var one ginkgoReport
		if err2 := json.Unmarshal(b, &one); err2 != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		reports = []ginkgoReport{one}
	}
	specs := map[string]specReport{}
	for _, r := range reports {
		for _, s := range r.SpecReports {
			if s.LeafNodeType == "It" {
				specs[s.name()] = s
			}
		}
	}
	return specs, reports, nil
}

// selected returns the names of the specs a dry run would run (Ginkgo
// reports them as passed; specs outside the focus as skipped).
func selected(dry map[string]specReport) []string {
	var names []string
	for n, s := range dry {
		if s.State == "passed" {
			names = append(names, n)
		}
	}
	sortNames(names)
	return names
}

// run is one selection of e2e.sh run against one cluster configuration: the
// directory e2e.sh wrote for it.
type run struct {
	dir      string
	meta     map[string]string
	selected []string              // the selection's specs, from the dry run
	results  map[string]specReport // the run's specs by name
	reports  []ginkgoReport
	skip     *regexp.Regexp // specs skipped by name (nil: none)
}

// readRun reads a directory e2e.sh wrote: meta.txt, selected.json and, if
// the run got that far, ginkgo/report.json.
func readRun(dir string) (*run, error) {
	r := &run{dir: dir}
	var err error
	if r.meta, err = readMeta(filepath.Join(dir, "meta.txt")); err != nil {
		return nil, err
	}
	dry, _, err := readSpecs(filepath.Join(dir, "selected.json"))
	if err != nil {
		return nil, err
	}
	r.selected = selected(dry)
	if re := r.meta["skip"]; re != "" {
		if r.skip, err = regexp.Compile(re); err != nil {
			return nil, fmt.Errorf("%s: skip: %w", dir, err)
		}
	}
	r.results, r.reports, err = readSpecs(filepath.Join(dir, "ginkgo", "report.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return r, nil
}

func readMeta(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			m[k] = v
		}
	}
	return m, sc.Err()
}

// skipped reports whether the run skips spec by name.
func (r *run) skipped(spec string) bool {
	return r.skip != nil && r.skip.MatchString(spec)
}

// result is one spec's outcome in a run: "passed", "failed" (also panicked
// or timed out), "skipped" (by name, as the run says why) or "" when the run
// has no final result for it.
func (r *run) result(spec string) string {
	s, ok := r.results[spec]
	if !ok {
		return ""
	}
	switch s.State {
	case "passed":
		return "passed"
	case "failed", "panicked", "timedout":
		return "failed"
	case "skipped":
		if r.skipped(spec) {
			return "skipped"
		}
	}
	return ""
}

// incomplete returns why the run is not a complete run of its selection, or
// "" when every selected spec has a final result and the suite was not
// interrupted.
func (r *run) incomplete() string {
	if r.results == nil {
		return "no report (e2e.test did not finish)"
	}
	for _, rep := range r.reports {
		for _, why := range rep.SpecialSuiteFailureReasons {
			if strings.Contains(why, "Interrupted") || strings.Contains(why, "Timeout") {
				return "the suite was interrupted: " + why
			}
		}
	}
	var missing []string
	for _, n := range r.selected {
		if r.result(n) == "" {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Sprintf("%d of %d selected specs have no result, first: %s", len(missing), len(r.selected), missing[0])
	}
	return ""
}

// counts returns how many selected specs passed, failed and were skipped.
func (r *run) counts() (passed, failed, skipped int) {
	for _, n := range r.selected {
		switch r.result(n) {
		case "passed":
			passed++
		case "failed":
			failed++
		case "skipped":
			skipped++
		}
	}
	return passed, failed, skipped
}
