package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDockerOpts(t *testing.T) {
	const masqOn = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.59.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
	const masqOff = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.7.1/24\nFLANNEL_MTU=1400\nFLANNEL_IPMASQ=false\n"
	const dual = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.59.1/24\nFLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:50::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
	const v6only = "FLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:50::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
	tests := []struct {
		name, file string
		args       []string
		want       string // the env file
		wantJSON   string // the daemon.json, when asked for
		wantErr    string
	}{
		{name: "weftd masquerades: docker must not", file: masqOn,
			want: "DOCKER_OPT_BIP=\"--bip=10.244.59.1/24\"\nDOCKER_OPT_IPMASQ=\"--ip-masq=false\"\nDOCKER_OPT_MTU=\"--mtu=1450\"\n" +
				"DOCKER_OPTS=\"--bip=10.244.59.1/24 --ip-masq=false --mtu=1450\"\n"},
		{name: "weftd does not masquerade: docker does", file: masqOff, args: []string{"-c"},
			want: "DOCKER_OPTS=\"--bip=10.244.7.1/24 --ip-masq=true --mtu=1400\"\n"},
		{name: "individual only, no masq option", file: masqOn, args: []string{"-i", "-m"},
			want: "DOCKER_OPT_BIP=\"--bip=10.244.59.1/24\"\nDOCKER_OPT_MTU=\"--mtu=1450\"\n"},
		{name: "combined key renamed", file: masqOn, args: []string{"-c", "-k", "WEFT_DOCKER"},
			want: "WEFT_DOCKER=\"--bip=10.244.59.1/24 --ip-masq=false --mtu=1450\"\n"},
		{name: "daemon.json", file: masqOn, args: []string{"-c", "-daemon-json", "JSON"},
			want:     "DOCKER_OPTS=\"--bip=10.244.59.1/24 --ip-masq=false --mtu=1450\"\n",
			wantJSON: "{\n  \"bip\": \"10.244.59.1/24\",\n  \"ip-masq\": false,\n  \"mtu\": 1450\n}\n"},
		{name: "dual-stack file: IPv4 options only", file: dual, args: []string{"-c"},
			want: "DOCKER_OPTS=\"--bip=10.244.59.1/24 --ip-masq=false --mtu=1450\"\n"},
		{name: "IPv6-only file", file: v6only, wantErr: "needs an IPv4 subnet"},
		{name: "incomplete file", file: "FLANNEL_SUBNET=10.244.59.1/24\n", wantErr: "read the subnet file"},
		{name: "no subnet file", wantErr: "is weftd running"},
		{name: "bad key", file: masqOn, args: []string{"-k", "DOCKER OPTS"}, wantErr: "not a valid variable name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			src, dst := filepath.Join(dir, "subnet.env"), filepath.Join(dir, "run", "docker_opts.env")
			if tt.file != "" {
				if err := os.WriteFile(src, []byte(tt.file), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			args := []string{"docker-opts", "-f", src, "-d", dst}
			for _, a := range tt.args {
				args = append(args, strings.ReplaceAll(a, "JSON", filepath.Join(dir, "daemon.json")))
			}
			var out, errOut bytes.Buffer
			err := run(context.Background(), args, &out, &errOut)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				if _, err := os.Stat(dst); err == nil {
					t.Error("an env file was written despite the error")
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v (%s)", err, errOut.String())
			}
			checkFile(t, dst, tt.want)
			if tt.wantJSON != "" {
				checkFile(t, filepath.Join(dir, "daemon.json"), tt.wantJSON)
			}
			if ents, _ := os.ReadDir(filepath.Dir(dst)); len(ents) != 1 {
				t.Errorf("%d files next to the env file, want only it (no temporary files)", len(ents))
			}
		})
	}
}

func checkFile(t *testing.T, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want {
		t.Errorf("%s:\n%s\nwant:\n%s", filepath.Base(path), b, want)
	}
	if st, err := os.Stat(path); err == nil && st.Mode().Perm() != 0o644 {
		t.Errorf("%s has mode %v, want 0644", path, st.Mode().Perm())
	}
}

func TestDockerOptsToStdout(t *testing.T) {
	src := filepath.Join(t.TempDir(), "subnet.env")
	os.WriteFile(src, []byte("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.59.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"), 0o644)
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"docker-opts", "-f", src, "-d", "-", "-c"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if want := "DOCKER_OPTS=\"--bip=10.244.59.1/24 --ip-masq=false --mtu=1450\"\n"; out.String() != want {
		t.Errorf("stdout %q, want %q", out.String(), want)
	}
}
