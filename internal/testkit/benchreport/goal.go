package benchreport

import (
	"fmt"
	"math"
)

// Goal is a figure a benchmark aims at. A benchmark names its goals only
// in Goal values and prints them only through Verdicts, so that every goal
// it names gets a verdict line, met or not (test/reportage checks this).
type Goal struct {
	Name   string  // the figure: "start to all routes, weftd"
	AtMost bool    // met when the figure is at most Bound; else at least
	Bound  float64 // in Unit
	Unit   string  // "s", "ms", "× flanneld's", "%"
}

// Verdict is g's line for the figure v (NaN: not measured): "goal: <name>
// ≤ <bound> <unit>: <v> <unit>, <v/bound>× the bound: met" or "not met".
func (g Goal) Verdict(v float64) string {
	op := "≥"
	if g.AtMost {
		op = "≤"
	}
	head := fmt.Sprintf("goal: %s %s %g %s: ", g.Name, op, g.Bound, g.Unit)
	if math.IsNaN(v) {
		return head + "not measured"
	}
	met := v >= g.Bound
	if g.AtMost {
		met = v <= g.Bound
	}
	verdict := "not met"
	if met {
		verdict = "met"
	}
	return fmt.Sprintf("%s%s %s, %.2f× the bound: %s", head, three(v), g.Unit, v/g.Bound, verdict)
}

// three is v with three significant digits, never in exponent form.
func three(v float64) string {
	prec := 2
	if v != 0 {
		prec = min(max(0, 2-int(math.Floor(math.Log10(math.Abs(v))))), 4)
	}
	return fmt.Sprintf("%.*f", prec, v)
}

// Verdicts is one verdict line per goal, in order; a goal without a figure
// in got is "not measured".
func Verdicts(goals []Goal, got map[string]float64) []string {
	out := make([]string, 0, len(goals))
	for _, g := range goals {
		v, ok := got[g.Name]
		if !ok {
			v = math.NaN()
		}
		out = append(out, g.Verdict(v))
	}
	return out
}
