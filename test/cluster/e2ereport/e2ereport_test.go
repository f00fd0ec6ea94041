package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/benchreport"
)

// spec makes a Ginkgo spec report of an It node.
func spec(container, leaf, state string, d time.Duration) map[string]any {
	return map[string]any{
		"ContainerHierarchyTexts": []string{"[sig-network] " + container},
		"LeafNodeType":            "It",
		"LeafNodeText":            leaf,
		"State":                   state,
		"RunTime":                 int64(d),
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeRun writes what e2e.sh writes for one selection: a dry run that
// selected three specs (one of them SCTP; a fourth outside the focus), and
// a run report with the results given.
func fakeRun(t *testing.T, dir string, results []map[string]any) {
	t.Helper()
	dry := []map[string]any{
		spec("DNS", "should provide DNS for the cluster [Conformance]", "passed", 0),
		spec("Services", "should serve a basic endpoint from pods [Conformance]", "passed", 0),
		spec("Services", "should allow creating a basic SCTP service [Feature:SCTPConnectivity]", "passed", 0),
		spec("Other", "is not selected", "skipped", 0),
		{"LeafNodeType": "SynchronizedBeforeSuite", "State": "passed"},
	}
	writeJSON(t, filepath.Join(dir, "selected.json"), []map[string]any{{"SpecReports": dry}})
	writeJSON(t, filepath.Join(dir, "ginkgo", "report.json"), []map[string]any{{"SuiteSucceeded": false, "SpecReports": results}})
	meta := "label=x\nselection=conformance\nkube_version=v1.37.2\ncommit=abc\nstarted=2026-12-06T15:00:00Z\nseconds=75\n" +
		"skip=\\[Feature:SCTPConnectivity\\]\nskip_reason=SCTP: this kernel has no SCTP\n"
	if err := os.WriteFile(filepath.Join(dir, "meta.txt"), []byte(meta), 0o644); err != nil {
		t.Fatal(err)
	}
}

// runMarkdown writes plan (a line "label<TAB>run directory" per run, the
// directories under root) and writes its report as `e2ereport markdown`
// does, with an age note naming the stamp's commit and measured paths (the
// fake runs' commits are not in git's history); it returns the path of the
// report it was asked to write.
func runMarkdown(t *testing.T, root, plan string) (string, error) {
	t.Helper()
	path := filepath.Join(root, "plan")
	if err := os.WriteFile(path, []byte(plan), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "conformance.md")
	return out, writeMarkdownAged(path, out, func(s benchreport.Stamp) (string, error) {
		return fmt.Sprintf("Measured at %s, %s; age of %s.", s.Commit, s.Date, strings.Join(s.Measures, " ")), nil
	})
}

// reportOf is the report runMarkdown writes, checked to hold every line
// of want.
func reportOf(t *testing.T, root, plan string, want ...string) string {
	t.Helper()
	out, err := runMarkdown(t, root, plan)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	for _, w := range want {
		if !strings.Contains(md, w) {
			t.Errorf("the report lacks %q:\n%s", w, md)
		}
	}
	return md
}

func TestMarkdownOfACompleteRun(t *testing.T) {
	root := t.TempDir()
	fakeRun(t, filepath.Join(root, "a"), []map[string]any{
		spec("DNS", "should provide DNS for the cluster [Conformance]", "passed", 12*time.Second),
		spec("Services", "should serve a basic endpoint from pods [Conformance]", "failed", 30*time.Second),
		spec("Services", "should allow creating a basic SCTP service [Feature:SCTPConnectivity]", "skipped", 0),
	})
	md := reportOf(t, root, "weft vxlan, iptables\ta\n",
		"| [sig-network] DNS should provide DNS for the cluster [Conformance] | pass (12s) |",
		"| [sig-network] Services should serve a basic endpoint from pods [Conformance] | **FAIL** (30s) |",
		"SCTP service [Feature:SCTPConnectivity] | skipped by name |",
		"| weft vxlan, iptables | conformance | 3 | 1 | 1 | 1 | 1m15s |",
		"- weft commit: abc", "- Kubernetes: v1.37.2",
		"**weft vxlan, iptables: conformance**\n<!-- weft-report ",
		"Measured at abc, 2026-12-06 15:00 UTC; age of cmd/weftd cmd/weft internal/daemon internal/fdstore internal/flagenv subnet vtep backend policy flow plugin kube-manifests test/cluster test/kube test/versions.env.",
	)
	if strings.Contains(md, "is not selected") {
		t.Errorf("the report lists a spec outside the selection:\n%s", md)
	}
	ss, err := benchreport.Stamps([]byte(md))
	if err != nil || len(ss) != 1 {
		t.Fatalf("stamps %+v, %v; want one", ss, err)
	}
	want := benchreport.Stamp{ID: "weft-vxlan-iptables-conformance", Commit: "abc", Date: "2026-12-06 15:00 UTC",
		Measures: append(slices.Clone(weftMeasures), harness...), Command: "sudo WEFT_CONFORMANCE_ONLY='^weft vxlan, iptables$' test/cluster/conformance.sh"}
	if !reflect.DeepEqual(ss[0], want) {
		t.Errorf("stamp %+v, want %+v", ss[0], want)
	}
}

// An incomplete run (a selected spec without a result, or a spec skipped
// that no skip names) writes nothing.
func TestMarkdownRefusesAnIncompleteRun(t *testing.T) {
	for name, results := range map[string][]map[string]any{
		"missing": {
			spec("DNS", "should provide DNS for the cluster [Conformance]", "passed", time.Second),
			spec("Services", "should allow creating a basic SCTP service [Feature:SCTPConnectivity]", "skipped", 0),
		},
		"skipped without a reason": {
			spec("DNS", "should provide DNS for the cluster [Conformance]", "passed", time.Second),
			spec("Services", "should serve a basic endpoint from pods [Conformance]", "skipped", 0),
			spec("Services", "should allow creating a basic SCTP service [Feature:SCTPConnectivity]", "skipped", 0),
		},
		"interrupted": {
			spec("DNS", "should provide DNS for the cluster [Conformance]", "passed", time.Second),
			spec("Services", "should serve a basic endpoint from pods [Conformance]", "interrupted", 0),
			spec("Services", "should allow creating a basic SCTP service [Feature:SCTPConnectivity]", "skipped", 0),
		},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			fakeRun(t, filepath.Join(root, "a"), results)
			out, err := runMarkdown(t, root, "weft vxlan, iptables\ta\n")
			if err == nil || !strings.Contains(err.Error(), "not a complete run") {
				t.Fatalf("markdown of an incomplete run: %v, want an error", err)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("%s was written: %v", out, err)
			}
		})
	}
}

// completeRuns writes a complete run in each of dirs under root.
func completeRuns(t *testing.T, root string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		fakeRun(t, filepath.Join(root, d), []map[string]any{
			spec("DNS", "should provide DNS for the cluster [Conformance]", "passed", time.Second),
			spec("Services", "should serve a basic endpoint from pods [Conformance]", "passed", time.Second),
			spec("Services", "should allow creating a basic SCTP service [Feature:SCTPConnectivity]", "skipped", 0),
		})
	}
}

// addMeta appends lines to run dir's meta.txt (a later key wins).
func addMeta(t *testing.T, dir, lines string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "meta.txt"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(lines); err != nil {
		t.Fatal(err)
	}
}

// Runs made separately (conformance.sh WEFT_CONFORMANCE_ONLY) may come
// from different commits and Kubernetes versions: the report says so and
// gives each run's own.
func TestMarkdownOfRunsFromDifferentCommits(t *testing.T) {
	root := t.TempDir()
	completeRuns(t, root, "a", "b")
	addMeta(t, filepath.Join(root, "b"), "commit=def\nstarted=2026-12-07T09:00:00Z\nkube_version=v1.38.0\nup_seconds=190\n")
	reportOf(t, root, "weft vxlan, iptables\ta\nFlannel, iptables\tb\n",
		"- weft commit: **the runs come from different commits** (abc, def)",
		"- Kubernetes: **the runs used different versions** (v1.37.2, v1.38.0)",
		"- Dates: 2026-12-06T15:00:00Z to 2026-12-07T09:00:00Z",
		"| weft vxlan, iptables | conformance | 3 | 2 | 0 | 1 | 1m15s | abc | 2026-12-06T15:00:00Z | v1.37.2 |  |",
		"| Flannel, iptables | conformance | 3 | 2 | 0 | 1 | 1m15s | def | 2026-12-07T09:00:00Z | v1.38.0 | 3m10s |",
		// Flannel's run measures only the harness of weft's tree.
		"Measured at def, 2026-12-07 09:00 UTC; age of test/cluster test/kube test/versions.env.",
	)
}

// TestMarkdownCommandAges: `e2ereport markdown` writes each run's age note
// from git (a run of this repository's HEAD measured nothing that changed
// since), and a note saying why where git cannot tell (a commit git does
// not know), keeping the results.
func TestMarkdownCommandAges(t *testing.T) {
	head, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		t.Fatalf("git: %v", err)
	}
	root := t.TempDir()
	completeRuns(t, root, "a", "b")
	addMeta(t, filepath.Join(root, "a"), "commit="+strings.TrimSpace(string(head))+"\n")
	addMeta(t, filepath.Join(root, "b"), "commit=0000000\n")
	plan := filepath.Join(root, "plan")
	if err := os.WriteFile(plan, []byte("weft vxlan, iptables\ta\nFlannel, iptables\tb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "conformance.md")
	if err := run1([]string{"markdown", "-o", out, plan}, io.Discard); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"\nMeasured at " + strings.TrimSpace(string(head)) + ", 2026-12-06 15:00 UTC; ",
		"\nMeasured at 0000000, 2026-12-06 15:00 UTC; its age is unknown here: ",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the report lacks %q:\n%s", want, b)
		}
	}
}

// TestCommitCommand: e2e.sh writes `e2ereport commit` as each run's
// commit, which is benchreport.Commit's: "+changes" for uncommitted code
// only (TestCommitChanges), not for the reports an earlier run wrote into
// the same tree (docs/conformance.md), which once made every later column
// "+dirty".
func TestCommitCommand(t *testing.T) {
	var b strings.Builder
	if err := run1([]string{"commit", "../../.."}, &b); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(b.String()), benchreport.Commit("../../.."); got != want {
		t.Errorf("e2ereport commit: %q, want benchreport.Commit's %q", got, want)
	}
	sh, err := os.ReadFile("../e2e.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^commit="\$\(report_tool commit "\$repo"\)"$`).Match(sh) || strings.Contains(string(sh), "+dirty") {
		t.Error(`test/cluster/e2e.sh does not take a run's commit from "e2ereport commit"`)
	}
}
