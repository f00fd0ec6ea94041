package extension

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readPID reads the process ID a command wrote to path.
func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestRunDoesNotHang: a command that leaves a process in the background
// holding its output returns once the shell is done (after outputWait at
// most), with the shell's output and no error; a command still running
// when ctx is done is killed with every process it started.
func TestRunDoesNotHang(t *testing.T) {
	dir := t.TempDir()
	t.Run("background process keeps the output", func(t *testing.T) {
		pidFile := filepath.Join(dir, "bg")
		start := time.Now()
		out, err := run(context.Background(), "/bin/sh", "sleep 30 & echo $! > "+pidFile+"; echo started", nil, "")
		pid := readPID(t, pidFile)
		defer syscall.Kill(pid, syscall.SIGKILL) // the test's own sleep
		if err != nil || out != "started" {
			t.Errorf("run = %q, %v; want \"started\", nil", out, err)
		}
		if took := time.Since(start); took > outputWait+2*time.Second {
			t.Errorf("run took %v with a process left in the background", took)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		pidFile := filepath.Join(dir, "fg")
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(300*time.Millisecond, cancel)
		start := time.Now()
		_, err := run(ctx, "/bin/sh", "sleep 30 & echo $! > "+pidFile+"; wait", nil, "")
		if err == nil {
			t.Error("run of a cancelled command returned no error")
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("run took %v after its context was cancelled", took)
		}
		pid := readPID(t, pidFile)
		deadline := time.Now().Add(2 * time.Second)
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if syscall.Kill(pid, 0) == nil {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("the command's background process %d outlived the cancelled command", pid)
		}
	})
}
