// Package faults is weft's fault suite: each test injects one fault into
// real weftd, etcd and CNI plugin processes running in network namespaces and
// asserts the goal of its row in docs/reliability.md. Every row runs a short
// variant in the normal `go test` run; run.sh runs the long variants and
// writes docs/reliability.md from the figures measured.
package faults
