package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/weft-net/weft/internal/testkit/benchreport"
)

// doc is one markdown file and its text with the notes as they are now.
type doc struct {
	path, abs string // relative to the root, absolute
	old, new  []byte
}

// marker names, in a figure row, the report section its figures are from.
var marker = regexp.MustCompile(`<!-- age ([^\s<>]+)#([^\s<>]+) -->`)

// markdown is every markdown file of the tree at root, relative paths.
func markdown(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return nil
	})
	return out, err
}

// stamps is every stamp of the files, by "<file>#<id>".
func stamps(root string, files []string) (map[string]benchreport.Stamp, error) {
	out := map[string]benchreport.Stamp{}
	for _, f := range files {
		text, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		ss, err := benchreport.Stamps(text)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, s := range ss {
			out[f+"#"+s.ID] = s
		}
	}
	return out, nil
}

// update is every markdown file with its notes as git says they are now.
func update(root string) ([]doc, error) {
	files, err := markdown(root)
	if err != nil {
		return nil, err
	}
	all, err := stamps(root, files)
	if err != nil {
		return nil, err
	}
	ages := map[string]string{}
	age := func(key string) (string, error) {
		if a, ok := ages[key]; ok {
			return a, nil
		}
		s, ok := all[key]
		if !ok {
			return "", fmt.Errorf("no report stamp %s", key)
		}
		a, err := benchreport.Age(root, s)
		ages[key] = a
		return a, err
	}
	var out []doc
	for _, f := range files {
		d := doc{path: f, abs: filepath.Join(root, f)}
		if d.old, err = os.ReadFile(d.abs); err != nil {
			return nil, err
		}
		if d.new, err = notes(f, d.old, age); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// notes is text with the line after each stamp, and the rest of each
// marker's table cell, set to the note age gives.
func notes(file string, text []byte, age func(key string) (string, error)) ([]byte, error) {
	lines := strings.Split(string(text), "\n")
	var out []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if s, ok, _ := benchreport.ParseStamp(l); ok {
			a, err := age(file + "#" + s.ID)
			if err != nil {
				return nil, err
			}
			out = append(out, l, a)
			if i+1 < len(lines) && strings.HasPrefix(lines[i+1], "Measured at ") {
				i++
			}
			continue
		}
		for _, m := range marker.FindAllStringSubmatchIndex(l, -1) {
			a, err := age(l[m[2]:m[3]] + "#" + l[m[4]:m[5]])
			if err != nil {
				return nil, err
			}
			end := m[1] + strings.IndexAny(l[m[1]:]+"|", "|")
			note := " m" + strings.TrimPrefix(a, "M")
			if end < len(l) {
				note += " "
			}
			l = l[:m[1]] + note + l[end:]
			break // one marker a line: the indices after it moved
		}
		out = append(out, l)
	}
	return []byte(strings.Join(out, "\n")), nil
}
