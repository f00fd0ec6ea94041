package benchreport

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// notCode are git pathspecs of tracked files that hold no code a report
// measures: markdown, and the package docs (doc.go files, which hold a
// package comment and clause only: TestDocFilesHoldNoCode).
var notCode = []string{":(exclude)*.md", ":(exclude)doc.go", ":(exclude)*/doc.go"}

// stampPrefix begins the one line by which a report says what it measured.
const stampPrefix = "<!-- weft-report "

// Stamp is what a report (or one section of it) measured: the tree's commit
// ("+changes" when tracked files differed), when, by which command, and the
// repository paths whose code its figures describe.
type Stamp struct {
	ID       string   `json:"id"` // the section's name, unique in its file
	Commit   string   `json:"commit"`
	Date     string   `json:"date"` // "2006-01-02 15:04 UTC"
	Measures []string `json:"measures"`
	Command  string   `json:"command"`
}

// NewStamp stamps a report made now from the tree at root.
func NewStamp(root, id, command string, measures ...string) Stamp {
	return Stamp{ID: id, Commit: Commit(root), Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		Measures: measures, Command: command}
}

// Line is the stamp as one HTML comment line (JSON escapes '>', so the
// comment cannot end early).
func (s Stamp) Line() string {
	b, _ := json.Marshal(s)
	return stampPrefix + string(b) + " -->"
}

// Markdown is the stamp's line and, on the next line, its age note as
// Age finds it now at root.
func (s Stamp) Markdown(root string) (string, error) {
	if _, _, err := ParseStamp(s.Line()); err != nil {
		return "", err
	}
	age, err := Age(root, s)
	if err != nil {
		return "", err
	}
	return s.Line() + "\n" + age + "\n", nil
}

// ParseStamp reads a line Line wrote; ok is false for any other line.
func ParseStamp(line string) (s Stamp, ok bool, err error) {
	rest, found := strings.CutPrefix(strings.TrimSpace(line), stampPrefix)
	if !found {
		return s, false, nil
	}
	rest, found = strings.CutSuffix(rest, " -->")
	if !found {
		return s, true, fmt.Errorf("report stamp %q: no end", line)
	}
	if err := json.Unmarshal([]byte(rest), &s); err != nil {
		return s, true, fmt.Errorf("report stamp %q: %w", line, err)
	}
	if s.ID == "" || s.Commit == "" || s.Date == "" || len(s.Measures) == 0 || s.Command == "" {
		return s, true, fmt.Errorf("report stamp %q: id, commit, date, measures and command are all needed", line)
	}
	return s, true, nil
}

// Age says how old s's figures are against the tree at root: "Measured at
// <commit>, <date>; since then these measured paths changed: <paths>." or
// "…; nothing it measures changed since.", leaving test files (*_test.go),
// markdown and package docs (doc.go) out. Uncommitted changes to tracked files count as the commit they will
// become, so that a note written before committing is still right after.
// The note names paths, not a count of commits, so that it changes only
// when another measured path does.
func Age(root string, s Stamp) (string, error) {
	commit, _, _ := strings.Cut(s.Commit, "+")
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
		return string(out), nil
	}
	if out, err := git("rev-parse", "--is-shallow-repository"); err != nil {
		return "", err
	} else if strings.TrimSpace(out) == "true" {
		return "", fmt.Errorf("report %s: this is a shallow clone, and a report's age needs the history since %s: run git fetch --unshallow", s.ID, commit)
	}
	if _, err := git("rev-parse", "--verify", "--quiet", commit+"^{commit}"); err != nil {
		return "", fmt.Errorf("report %s: its commit %q is not in this clone's history", s.ID, s.Commit)
	}
	spec := append(append([]string{"--"}, s.Measures...), append([]string{":(exclude)*_test.go"}, notCode...)...)
	for _, p := range s.Measures {
		if out, err := git("ls-files", "--", p); err != nil || out == "" {
			return "", fmt.Errorf("report %s: measured path %q has no files in this tree", s.ID, p)
		}
	}
	files, err := git(append([]string{"log", "--format=", "--name-only", commit + "..HEAD"}, spec...)...)
	if err != nil {
		return "", err
	}
	dirty, err := git(append([]string{"status", "--porcelain", "--untracked-files=no"}, spec...)...)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(dirty, "\n") {
		if len(l) > 3 {
			files += "\n" + l[3:]
		}
	}
	head := fmt.Sprintf("Measured at %s, %s; ", s.Commit, s.Date)
	var changed []string
	for _, p := range s.Measures {
		for _, f := range strings.Fields(files) {
			if f == p || strings.HasPrefix(f, strings.TrimSuffix(p, "/")+"/") {
				changed = append(changed, p)
				break
			}
		}
	}
	if len(changed) == 0 {
		return head + "nothing it measures changed since.", nil
	}
	return fmt.Sprintf("%ssince then these measured paths changed: %s.", head, strings.Join(changed, ", ")), nil
}

// Stamps are the stamps in a report's text, in order.
func Stamps(text []byte) ([]Stamp, error) {
	var out []Stamp
	for _, l := range bytes.Split(text, []byte("\n")) {
		s, ok, err := ParseStamp(string(l))
		if err != nil {
			return nil, err
		}
		if ok {
			if slices.ContainsFunc(out, func(o Stamp) bool { return o.ID == s.ID }) {
				return nil, fmt.Errorf("report stamp id %q appears twice", s.ID)
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// Root is the repository's root directory, for writers that run outside it
// (go test runs in the package's directory).
func Root() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("report: the repository's root: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}
