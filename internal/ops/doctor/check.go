package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Status is the outcome of one check.
type Status int

// Statuses, in increasing severity.
const (
	OK Status = iota
	Warn
	Fail
)

func (s Status) String() string {
	switch s {
	case OK:
		return "ok"
	case Warn:
		return "warn"
	}
	return "fail"
}

// MarshalText makes a Status "ok", "warn" or "fail" in JSON.
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Check is the result of one check: what it found and, unless it is OK,
// what to do about it.
type Check struct {
	Name     string `json:"name"`     // "kernel/ip_forward", "probe/10.244.3.0"
	Status   Status `json:"status"`   // ok, warn or fail
	Evidence string `json:"evidence"` // what was read or measured
	Fix      string `json:"fix,omitempty"`
}

// Report is every check run on one node.
type Report struct {
	Node   string  `json:"node"` // a name for the node: its public IP, lab or Kubernetes name
	Checks []Check `json:"checks"`
}

func (r *Report) add(name string, s Status, fix, format string, args ...any) {
	r.Checks = append(r.Checks, Check{Name: name, Status: s, Evidence: fmt.Sprintf(format, args...), Fix: fix})
}

func (r *Report) ok(name, format string, args ...any) { r.add(name, OK, "", format, args...) }

// Worst returns the most severe status in the report.
func (r *Report) Worst() Status {
	w := OK
	for _, c := range r.Checks {
		w = max(w, c.Status)
	}
	return w
}

// ExitCode is 0 when every check passed, 1 on a warning, 2 on a failure.
func (r *Report) ExitCode() int { return int(r.Worst()) }

// Find returns the checks whose name starts with prefix.
func (r *Report) Find(prefix string) []Check {
	var out []Check
	for _, c := range r.Checks {
		if strings.HasPrefix(c.Name, prefix) {
			out = append(out, c)
		}
	}
	return out
}

// Render prints one line per check, the fix indented below it, and a
// summary line.
func (r *Report) Render(w io.Writer) error {
	fmt.Fprintf(w, "doctor: %s\n", r.Node)
	n := [3]int{}
	for _, c := range r.Checks {
		n[c.Status]++
		fmt.Fprintf(w, "  %-4s  %-24s %s\n", c.Status, c.Name, c.Evidence)
		if c.Fix != "" && c.Status != OK {
			fmt.Fprintf(w, "        %-24s fix: %s\n", "", c.Fix)
		}
	}
	_, err := fmt.Fprintf(w, "%d checks: %d ok, %d warn, %d fail\n", len(r.Checks), n[OK], n[Warn], n[Fail])
	return err
}

// JSON writes the report as one JSON document.
func (r *Report) JSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(r)
}
