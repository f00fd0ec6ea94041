package lab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Proc identifies a process that the lab started, robustly against PID
// reuse: a PID is only ever signalled when the process that now has it
// started at the recorded time (clock ticks since boot, /proc/<pid>/stat
// field 22) and its command line still contains Marker.
type Proc struct {
	PID    int    `json:"pid"`
	Start  uint64 `json:"start"`
	Marker string `json:"marker"` // an argument unique to this process (a path under the state dir)
}

// procRoot is /proc; a field so that tests could point elsewhere is not
// needed: the real /proc is always there.
const procRoot = "/proc"

// IdentifyProc records the identity of the running process pid.
func IdentifyProc(pid int, marker string) (Proc, error) {
	start, err := procStart(pid)
	if err != nil {
		return Proc{}, err
	}
	return Proc{PID: pid, Start: start, Marker: marker}, nil
}

// Alive reports whether p is still the process that was recorded: same
// PID, same start time, and Marker in its command line. A zombie counts as
// gone.
func (p Proc) Alive() bool {
	if p.PID <= 0 {
		return false
	}
	start, err := procStart(p.PID)
	if err != nil || start != p.Start {
		return false
	}
	argv, err := procCmdline(p.PID)
	if err != nil {
		return false
	}
	return p.Marker == "" || containsMarker(argv, p.Marker)
}

func containsMarker(argv []string, marker string) bool {
	for _, a := range argv {
		if a == marker || strings.HasSuffix(a, "="+marker) {
			return true
		}
	}
	return false
}

func procCmdline(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/cmdline", procRoot, pid))
	if err != nil {
		return nil, err
	}
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil, errors.New("empty command line (zombie or kernel thread)")
	}
	return strings.Split(string(b), "\x00"), nil
}

// procStart returns field 22 (starttime) of /proc/<pid>/stat; a zombie
// ("Z" state) is reported as gone.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/stat", procRoot, pid))
	if err != nil {
		return 0, err
	}
	return parseStat(string(b))
}

// parseStat extracts the start time from a /proc/<pid>/stat line. The
// command name (field 2) is in parentheses and may itself contain spaces
// and parentheses, so fields are counted from the last ')'.
func parseStat(s string) (uint64, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse proc stat: no ')' in %q", s)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 20 {
		return 0, fmt.Errorf("parse proc stat: %d fields after the command name", len(f))
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, errors.New("process is a zombie")
	}
	return strconv.ParseUint(f[19], 10, 64)
}
