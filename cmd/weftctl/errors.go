package main

import (
	"errors"
	"flag"
	"fmt"
	"os/exec"
)

// errUsage is returned after the usage was printed.
var errUsage = errors.New("see usage above")

// errMismatch marks a check that ran and found the state wrong (exit 2),
// as opposed to a failure to run it (exit 1).
var errMismatch = errors.New("state does not match the datastore")

func exitCode(err error) int {
	var ee *exec.ExitError
	var doc errDoctor
	switch {
	case errors.As(err, &doc):
		return doc.code
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errMismatch), errors.Is(err, errUsage):
		return 2
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	return 1
}

// errDoctor carries the exit status of doctor or connectivity (1 warning,
// 2 failure); their report already said why.
type errDoctor struct{ code int }

func (e errDoctor) Error() string { return fmt.Sprintf("exit status %d", e.code) }
