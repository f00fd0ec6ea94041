package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestRunArguments(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantErr  string // substring of the error; "" for success
		wantCode int
	}{
		{"no command", nil, "see usage", 2},
		{"help", []string{"help"}, "", 0},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`, 1},
		{"explain needs two addresses", []string{"explain", "10.0.0.1"}, "want 2 arguments, got 1", 1},
		{"explain bad source", []string{"explain", "nonsense", "10.0.0.1"}, "source: ", 1},
		{"leases takes no argument", []string{"leases", "x"}, "want 0 arguments", 1},
		{"lab without subcommand", []string{"lab"}, "see usage", 2},
		{"lab unknown subcommand", []string{"lab", "sideways"}, `unknown command "sideways"`, 1},
		{"lab exec without command", []string{"lab", "exec", "node1"}, "see usage", 2},
		{"lab up without the plugin", []string{"lab", "up", "--weftd", "/bin/true", "--cni-bin", "/nonexistent"}, "--cni-bin /nonexistent", 1},
		{"flag help", []string{"leases", "-h"}, flag.ErrHelp.Error(), 0},
		{"lab status of no lab", []string{"lab", "status", "--state-dir", "/nonexistent/lab"}, "no lab", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tt.args, &out, &errOut)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			if got := exitCode(err); got != tt.wantCode {
				t.Errorf("exit code %d, want %d", got, tt.wantCode)
			}
		})
	}
	if exitCode(errors.Join(errMismatch)) != 2 {
		t.Error("a mismatch must exit 2")
	}
}
