package lab

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Matrix is the result of pinging every pod from every other pod and of a
// short TCP exchange between them.
type Matrix struct {
	Names []string
	// OK[i][j] reports whether Names[i] got an echo reply from Names[j],
	// TCP[i][j] whether a TCP exchange from Names[i] to Names[j] came back
	// intact; the diagonal is not tested.
	OK, TCP [][]bool
}

// NewMatrix makes an all-failed matrix for names.
func NewMatrix(names []string) *Matrix {
	m := &Matrix{Names: names, OK: make([][]bool, len(names)), TCP: make([][]bool, len(names))}
	for i := range m.OK {
		m.OK[i] = make([]bool, len(names))
		m.TCP[i] = make([]bool, len(names))
	}
	return m
}

// Failures lists "a → b (what failed)" for every pair where the ping or
// the TCP exchange failed.
func (m *Matrix) Failures() []string {
	var out []string
	for i, a := range m.Names {
		for j, b := range m.Names {
			switch {
			case i == j || m.OK[i][j] && m.TCP[i][j]:
			case m.OK[i][j]:
				out = append(out, a+" → "+b+" (tcp)")
			case m.TCP[i][j]:
				out = append(out, a+" → "+b+" (ping)")
			default:
				out = append(out, a+" → "+b+" (ping, tcp)")
			}
		}
	}
	return out
}

// Render prints the matrix with the source in rows: ✓ echo reply and TCP
// exchange, "ping" only the echo, "tcp" only the exchange, ✗ neither,
// · self.
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
			case m.OK[i][j] && m.TCP[i][j]:
				cells[j] = "✓"
			case m.OK[i][j]:
				cells[j] = "ping"
			case m.TCP[i][j]:
				cells[j] = "tcp"
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
	_, err := fmt.Fprintf(w, "%d/%d pairs reachable (ping and TCP)\n", total-len(m.Failures()), total)
	return err
}
