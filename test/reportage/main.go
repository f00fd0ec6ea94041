// Command reportage says how old every generated report is. Each report
// (or section) carries one stamp line (benchreport.Stamp: the commit, date
// and command it measured, and the paths whose code it measures); on the
// line after it, and after every `<!-- age <file>#<id> -->` marker in a
// figure row, it writes what changed in those paths since, from git.
//
//	go run ./test/reportage        # check: exit 1 when a note is stale
//	go run ./test/reportage -w     # rewrite the notes
//	go run ./test/reportage -stamp -id cni -command '…' -measures plugin,cmd/weft
//
// The last form prints a new stamp and its note, for report writers that
// are shell scripts. The test of this package fails on a stale note, a
// report or figure row without a commit, and a benchmark goal without a
// verdict.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/weft-net/weft/internal/testkit/benchreport"
)

func main() {
	write := flag.Bool("w", false, "rewrite the age notes")
	stamp := flag.Bool("stamp", false, "print a stamp for a report made now, and its note")
	id := flag.String("id", "", "with -stamp: the report's (or section's) id")
	command := flag.String("command", "", "with -stamp: the command that made the report")
	measures := flag.String("measures", "", "with -stamp: the measured paths, comma-separated")
	flag.Parse()
	if err := run(*write, *stamp, *id, *command, *measures); err != nil {
		fmt.Fprintln(os.Stderr, "reportage:", err)
		os.Exit(1)
	}
}

func run(write, stamp bool, id, command, measures string) error {
	root, err := benchreport.Root()
	if err != nil {
		return err
	}
	if stamp {
		md, err := benchreport.NewStamp(root, id, command, strings.Split(measures, ",")...).Markdown(root)
		if err != nil {
			return err
		}
		fmt.Print(md)
		return nil
	}
	if errs := check(root); len(errs) > 0 {
		for _, e := range errs {
			fmt.Fprintln(os.Stderr, e)
		}
		return fmt.Errorf("%d problems", len(errs))
	}
	docs, err := update(root)
	if err != nil {
		return err
	}
	stale := 0
	for _, d := range docs {
		if bytes.Equal(d.old, d.new) {
			continue
		}
		stale++
		if !write {
			fmt.Fprintf(os.Stderr, "%s: its age notes are stale\n", d.path)
			continue
		}
		if err := os.WriteFile(d.abs, d.new, 0o644); err != nil {
			return err
		}
		fmt.Printf("%s: age notes rewritten\n", d.path)
	}
	if stale > 0 && !write {
		return fmt.Errorf("%d files with stale age notes: run go run ./test/reportage -w", stale)
	}
	return nil
}
