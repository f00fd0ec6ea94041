package lab

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

func TestParseStat(t *testing.T) {
	fields := " S 1 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10"
	tests := []struct {
		name    string
		line    string
		want    uint64
		wantErr bool
	}{
		{"plain", "42 (weftd)" + fields, 123456, false},
		{"spaces and parens in the name", "42 (a) b (c)" + fields, 123456, false},
		{"zombie", "42 (weftd) Z 1 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10", 0, true},
		{"short", "42 (weftd) S 1 2", 0, true},
		{"garbage", "nonsense", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat(tt.line)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("parseStat = %d, %v; want %d, err %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestProcAlive(t *testing.T) {
	self, err := IdentifyProc(os.Getpid(), "")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "sleep 30; true", "/nonexistent/marker")
	if err := cmd.Start(); err != nil {
		nettest.CannotRun(t, nettest.SkipTools, "no sh: "+err.Error())
	}
	defer cmd.Process.Kill()
	child, err := IdentifyProc(cmd.Process.Pid, "/nonexistent/marker")
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(2 * time.Second); !child.Alive() && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond) // until the child has exec'd sh
	}
	tests := []struct {
		name string
		p    Proc
		want bool
	}{
		{"self", self, true},
		{"child with its marker", child, true},
		{"child, other marker", Proc{PID: child.PID, Start: child.Start, Marker: "/other"}, false},
		{"reused pid: other start time", Proc{PID: child.PID, Start: child.Start + 1, Marker: child.Marker}, false},
		{"no pid", Proc{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.Alive(); got != tt.want {
				t.Fatalf("Alive() = %v", got)
			}
		})
	}
	cmd.Process.Kill()
	cmd.Wait()
	if child.Alive() {
		t.Fatal("a reaped child is still alive")
	}
}
