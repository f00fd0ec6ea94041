// Package image tests weft's container image: build.sh builds it from the
// Dockerfile with a private dockerd and checks what it holds and runs.
package image

import (
	"errors"
	"os"
	"os/exec"
	"testing"
)

func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the image from source: minutes")
	}
	cmd := exec.Command("./build.sh")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 77 {
		t.Skip("docker.io cannot be installed here (or not root): skipping the image build")
	}
	if err != nil {
		t.Fatalf("test/image/build.sh: %v", err)
	}
}
