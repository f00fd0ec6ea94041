package web

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/weft-net/weft/flow"
)

// Flows reads the latest flows of the nodes the page shows (weftd's
// /flows), oldest first, at most limit; the errors are those of nodes
// that did not answer.
type Flows func(ctx context.Context, limit int) ([]flow.Flow, []error)

// FlowView is a flow as the flows panel shows it.
type FlowView struct {
	flow.Flow
	Reason string `json:"reason"`
}

var errNoFlows = errors.New("no flows here: this page was started without a weftd to read them from")

// flowsLimit is how many flows the panel shows.
const flowsLimit = 50

func (s *Server) flows(w http.ResponseWriter, r *http.Request) {
	if s.Flows == nil {
		s.jsonError(w, http.StatusNotFound, errNoFlows)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	fs, errs := s.Flows(ctx, flowsLimit)
	out := struct {
		Flows  []FlowView `json:"flows"`
		Errors []string   `json:"errors"`
	}{Flows: []FlowView{}, Errors: []string{}}
	for _, f := range fs {
		out.Flows = append(out.Flows, FlowView{f, f.Reason()})
	}
	for _, err := range errs {
		out.Errors = append(out.Errors, s.scrub(err.Error()))
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}
