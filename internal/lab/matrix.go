package lab

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Matrix is the result of pinging every pod from every other pod.
type Matrix struct {
	Names []string
	// OK[i][j] reports whether Names[i] got a reply from Names[j]; the
	// diagonal is not tested.
	OK [][]bool
}

// NewMatrix makes an all-failed matrix for names.
func NewMatrix(names []string) *Matrix {
	m := &Matrix{Names: names, OK: make([][]bool, len(names))}
	for i := range m.OK {
		m.OK[i] = make([]bool, len(names))
	}
	return m
}

// Failures lists "a → b" for every pair without a reply.
func (m *Matrix) Failures() []string {
	var out []string
	for i, a := range m.Names {
		for j, b := range m.Names {
			if i != j && !m.OK[i][j] {
				out = append(out, a+" → "+b)
			}
		}
	}
	return out
}

// Render prints the matrix with the source in rows: ✓ reply, ✗ none, · self.
func (m *Matrix) Render(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "from \\ to\t")
	for _, n := range m.Names {
		fmt.Fprintf(tw, "%s\t", n)
	}
	fmt.Fprintln(tw)
	for i, a := range m.Names {
		cells := make([]string, len(m.Names))
		for j := range m.Names {
			switch {
			case i == j:
				cells[j] = "·"
			case m.OK[i][j]:
				cells[j] = "✓"
			default:
				cells[j] = "✗"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t\n", a, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	total := len(m.Names) * (len(m.Names) - 1)
	_, err := fmt.Fprintf(w, "%d/%d pairs reachable\n", total-len(m.Failures()), total)
	return err
}
