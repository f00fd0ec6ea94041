// Command e2ereport reads the reports test/cluster/e2e.sh writes (Ginkgo's
// JSON reports of Kubernetes' e2e.test) and writes docs/conformance.md from
// a complete run of every cluster configuration, with a stamp for each
// run (its commit, date, command and the paths whose code it ran), after
// which test/reportage keeps the note of what has changed since.
//
//	e2ereport list SELECTED.json                 the specs a dry run selected
//	e2ereport count [-skip RE] SELECTED.json     how many, and how many RE skips
//	e2ereport summary RUNDIR                     one run's results
//	e2ereport markdown -o FILE PLAN              docs/conformance.md
//	e2ereport commit REPO                        the commit a run measures
//
// PLAN has one line per run: "COLUMN<TAB>RUNDIR", COLUMN being the
// configuration ("weft vxlan, kube-proxy iptables"); markdown refuses to
// write unless every run in it is complete.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/weft-net/weft/internal/testkit/benchreport"
)

func main() {
	if err := run1(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "e2ereport:", err)
		os.Exit(1)
	}
}

func run1(args []string, out io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: e2ereport list|count|summary|markdown|commit ...")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	skip := fs.String("skip", "", "count: the regular expression of the specs skipped by name")
	outFile := fs.String("o", "docs/conformance.md", "markdown: the file to write")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%s needs one argument", args[0])
	}
	arg := fs.Arg(0)
	switch args[0] {
	case "list", "count":
		dry, _, err := readSpecs(arg)
		if err != nil {
			return err
		}
		names := selected(dry)
		if args[0] == "list" {
			for _, n := range names {
				fmt.Fprintln(out, n)
			}
			return nil
		}
		return count(out, names, *skip)
	case "summary":
		r, err := readRun(arg)
		if err != nil {
			return err
		}
		summary(out, r)
		return nil
	case "markdown":
		return writeMarkdown(arg, *outFile)
	case "commit":
		// The benchmarks' rule: "+changes" only for uncommitted code, not
		// for reports (docs/conformance.md among them) written in the tree.
		fmt.Fprintln(out, benchreport.Commit(arg))
		return nil
	}
	return fmt.Errorf("unknown command %q", args[0])
}

func count(out io.Writer, names []string, skip string) error {
	n := 0
	if skip != "" {
		re, err := regexp.Compile(skip)
		if err != nil {
			return err
		}
		for _, s := range names {
			if re.MatchString(s) {
				n++
			}
		}
	}
	fmt.Fprintf(out, "%d specs selected, %d of them skipped by name\n", len(names), n)
	return nil
}

func summary(out io.Writer, r *run) {
	p, f, s := r.counts()
	fmt.Fprintf(out, "%s: %d specs: %d passed, %d failed, %d skipped by name, in %s s\n",
		r.meta["selection"], len(r.selected), p, f, s, r.meta["seconds"])
	for _, n := range r.selected {
		if r.result(n) == "failed" {
			msg := ""
			if fr := r.results[n].Failure; fr != nil {
				msg = firstLine(fr.Message)
			}
			fmt.Fprintf(out, "  FAILED %s\n    %s\n", n, msg)
		}
	}
	if why := r.incomplete(); why != "" {
		fmt.Fprintf(out, "  INCOMPLETE: %s\n", why)
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

func sortNames(names []string) { slices.Sort(names) }
