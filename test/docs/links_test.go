// Package docs checks the links of the repository's markdown: each relative
// link (and image) names a file of the repository, and each #anchor a
// heading of its page, as GitHub makes anchors from headings.
package docs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

var (
	mdLink   = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	htmlLink = regexp.MustCompile(`<(?:a|img)\s[^>]*(?:href|src)="([^"]+)"`)
	heading  = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	codeSpan = regexp.MustCompile("`[^`]*`")
)

// link is one link of a page: its target as written, and where.
type link struct {
	target string
	line   int
}

// scan returns the links of a markdown text outside code blocks and code
// spans (a link's text may run over lines), and the anchors of its
// headings.
func scan(text string) (links []link, anchors map[string]bool) {
	anchors = map[string]bool{}
	seen := map[string]int{}
	fence := ""
	lines := strings.Split(text, "\n")
	plain := make([]string, len(lines)) // the lines links are read from
	for i, l := range lines {
		t := strings.TrimSpace(l)
		switch {
		case fence != "":
			if strings.HasPrefix(t, fence) {
				fence = ""
			}
			continue
		case strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~"):
			fence = t[:3]
			continue
		case strings.HasPrefix(l, "    ") || strings.HasPrefix(l, "\t"):
			continue // an indented code block (or a nested list's line)
		}
		if m := heading.FindStringSubmatch(l); m != nil {
			a := anchor(m[1])
			if n := seen[a]; n > 0 {
				anchors[fmt.Sprintf("%s-%d", a, n)] = true
			} else {
				anchors[a] = true
			}
			seen[a]++
		}
		plain[i] = codeSpan.ReplaceAllString(l, "")
	}
	all := strings.Join(plain, "\n")
	for _, re := range []*regexp.Regexp{mdLink, htmlLink} {
		for _, m := range re.FindAllStringSubmatchIndex(all, -1) {
			links = append(links, link{target: all[m[2]:m[3]], line: strings.Count(all[:m[2]], "\n") + 1})
		}
	}
	slices.SortStableFunc(links, func(a, b link) int { return a.line - b.line })
	return links, anchors
}

// anchor is GitHub's anchor of a heading: its text (a link's text, a code
// span's content) lower-cased, with letters, digits, '_' and '-' kept,
// spaces made '-' and everything else dropped.
func anchor(h string) string {
	h = mdLink.ReplaceAllStringFunc(h, func(s string) string { return s[strings.Index(s, "[")+1 : strings.Index(s, "]")] })
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' || r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// check returns what is wrong with the links of page (a path relative to
// root): a target outside the repository, a missing file, or an anchor no
// heading of its page makes. A link starting with / is from the root.
func check(root, page string, read func(string) (string, error)) ([]string, error) {
	text, err := read(page)
	if err != nil {
		return nil, err
	}
	links, _ := scan(text)
	var bad []string
	for _, l := range links {
		t := l.target
		if strings.Contains(t, "://") || strings.HasPrefix(t, "mailto:") {
			continue
		}
		file, frag, _ := strings.Cut(t, "#")
		target := page
		switch {
		case strings.HasPrefix(file, "/"): // from the repository's root, as GitHub takes it
			target = filepath.ToSlash(filepath.Clean(strings.TrimPrefix(file, "/")))
		case file != "":
			target = filepath.ToSlash(filepath.Join(filepath.Dir(page), file))
		}
		where := fmt.Sprintf("%s:%d: %s", page, l.line, t)
		if target == ".." || strings.HasPrefix(target, "../") {
			bad = append(bad, where+": outside the repository")
			continue
		}
		if _, err := os.Stat(filepath.Join(root, target)); err != nil {
			bad = append(bad, where+": no such file")
			continue
		}
		if frag == "" || !strings.HasSuffix(target, ".md") {
			continue
		}
		body, err := read(target)
		if err != nil {
			return nil, err
		}
		if _, anchors := scan(body); !anchors[frag] {
			bad = append(bad, where+": no heading makes #"+frag)
		}
	}
	return bad, nil
}

func TestLinksResolve(t *testing.T) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("the repository's root: %v", err)
	}
	root := strings.TrimSpace(string(out))
	files, err := exec.Command("git", "-C", root, "ls-files", "--", "*.md").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	read := func(p string) (string, error) {
		b, err := os.ReadFile(filepath.Join(root, p))
		return string(b), err
	}
	pages := strings.Fields(string(files))
	if len(pages) < 20 {
		t.Fatalf("only %d markdown files tracked: %v", len(pages), pages)
	}
	for _, p := range pages {
		bad, err := check(root, p, read)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bad {
			t.Error(b)
		}
	}
}

// TestCheckFindsBrokenLinks: each kind of broken link is reported, and the
// good ones, code and external links are not.
func TestCheckFindsBrokenLinks(t *testing.T) {
	root := t.TempDir()
	pages := map[string]string{
		"README.md": "# weft\n\n## Two commands\n\n[ok](docs/a.md#the-tables-weftd-writes) [ok](#two-commands) [ok](https://example.com/x)\n" +
			"[gone](docs/gone.md) [anchor](docs/a.md#nothing) [out](../shared/x.md) [root](/docs/a.md) `[code](docs/gone.md)` [a link\nover lines](docs/gone2.md)\n" +
			"```\n[fenced](docs/gone.md)\n```\n<img src=\"docs/pic.png\"> <img src=\"docs/nopic.png\">\n",
		"docs/a.md": "# A\n\n## The tables weftd writes\n\n## `weftctl flows` (and `--flows`)\n\n[self](#weftctl-flows-and---flows) [up](../README.md#two-commands)\n",
	}
	for p, text := range pages {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "docs/pic.png"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	read := func(p string) (string, error) {
		b, err := os.ReadFile(filepath.Join(root, p))
		return string(b), err
	}
	var got []string
	for _, p := range []string{"README.md", "docs/a.md"} {
		bad, err := check(root, p, read)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, bad...)
	}
	want := []string{
		"README.md:6: docs/gone.md: no such file",
		"README.md:6: docs/a.md#nothing: no heading makes #nothing",
		"README.md:6: ../shared/x.md: outside the repository",
		"README.md:7: docs/gone2.md: no such file",
		"README.md:11: docs/nopic.png: no such file",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
