// Package faults is weft's fault suite: each test injects one fault into
// real weftd, etcd and CNI plugin processes running in network namespaces and
// asserts the goal of its row in docs/reliability.md. Every row runs a short
// variant in the normal `go test` run; run.sh runs the long variants and
// writes docs/reliability.md from the figures measured. test/run.sh's pass
// under the race detector skips, by name, the rows whose weft code runs
// only in the binaries (built without it); a new row of that kind belongs
// in its list.
package faults
