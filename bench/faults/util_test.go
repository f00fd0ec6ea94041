package faults

import "strings"

func splitLines(s string) []string { return strings.Split(strings.TrimSpace(s), "\n") }
