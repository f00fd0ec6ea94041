package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/weft-net/weft/internal/flagenv"
	"github.com/weft-net/weft/internal/ops/inspect"
)

func runLeases(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("weftctl leases", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var s store
	s.register(fs)
	var margin time.Duration
	var stale bool
	set := &flagenv.Set{FS: fs}
	set.Minutes(&margin, "subnet-lease-renew-margin", inspect.DefaultRenewMargin,
		"the nodes renew their leases this long before expiry, as weftd's and flanneld's flag of that name (minutes or a duration); a lease not renewed on time is OVERDUE")
	fs.BoolVar(&stale, "stale", false, "list only the leases whose node has not renewed them on time")
	if err := set.Err(); err != nil {
		return err
	}
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	if margin <= 0 {
		return fmt.Errorf("weftctl leases: --subnet-lease-renew-margin %s: must be positive", margin)
	}
	if _, err := s.labState(); err != nil {
		return err
	}
	ls, _, from, err := s.listed(ctx, logger(stderr))
	if err != nil {
		return err
	}
	now := time.Now()
	if stale {
		all := len(ls)
		ls = slices.DeleteFunc(ls, func(l inspect.Listed) bool { _, overdue := inspect.Overdue(l, margin, now); return !overdue })
		fmt.Fprintf(stdout, "%d of %d leases in %s not renewed on time\n", len(ls), all, from)
	} else {
		fmt.Fprintf(stdout, "%d leases in %s\n", len(ls), from)
	}
	return inspect.RenderLeases(stdout, ls, margin, now)
}

// parse parses args, flags anywhere among them, and checks that exactly
// n positional arguments are given (see parseArgs to get them).
func parse(fs *flag.FlagSet, args []string, n int) error {
	_, err := parseArgs(fs, args, n)
	return err
}

// parseArgs parses args, flags anywhere among the positional arguments (as
// in "explain A B --lab"; after "--" everything is positional), checks
// that exactly n positional arguments are given and returns them.
func parseArgs(fs *flag.FlagSet, args []string, n int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if dashdash := len(args) > len(rest) && args[len(args)-len(rest)-1] == "--"; dashdash {
			pos = append(pos, rest...)
			break
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
	if len(pos) != n {
		fs.Usage()
		return nil, fmt.Errorf("%s: want %d arguments, got %d", fs.Name(), n, len(pos))
	}
	return pos, nil
}

// jsonOut writes v as indented JSON.
func jsonOut(w io.Writer, v any) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(v)
}
