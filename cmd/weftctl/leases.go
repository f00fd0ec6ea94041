package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/weft-net/weft/internal/inspect"
)

func runLeases(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("weftctl leases", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var s store
	s.register(fs)
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	if _, err := s.labState(); err != nil {
		return err
	}
	ls, _, from, err := s.leases(ctx, logger(stderr))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d leases in %s\n", len(ls), from)
	return inspect.RenderLeases(stdout, ls, time.Now())
}

// parse parses args and checks that exactly n positional arguments remain.
func parse(fs *flag.FlagSet, args []string, n int) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != n {
		fs.Usage()
		return fmt.Errorf("%s: want %d arguments, got %d", fs.Name(), n, fs.NArg())
	}
	return nil
}
