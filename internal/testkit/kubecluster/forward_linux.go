package kubecluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// ForwardArg, as a program's first argument, makes MaybeForward run the
// API server's loopback forwarder instead of the program. Up starts it as
// `<Config.Self> ForwardArg <port file> <netns> <target>`.
const ForwardArg = "--weft-kubecluster-forward"

// MaybeForward runs the forwarder and exits when the program was started
// as one (see ForwardArg); otherwise it returns at once. Programs that
// call Up (the cluster command, its tests) call it first thing in main or
// TestMain.
func MaybeForward() {
	if len(os.Args) < 2 || os.Args[1] != ForwardArg {
		return
	}
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: "+ForwardArg+" <port file> <netns path> <host:port>")
		os.Exit(2)
	}
	if err := forward(context.Background(), os.Args[2], os.Args[3], os.Args[4]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// forward listens on a free port of 127.0.0.1 in the caller's network
// namespace (the machine's loopback: nothing else is touched), writes the
// port to portFile, and splices every connection to target, dialled from
// inside the network namespace at netnsPath.
func forward(ctx context.Context, portFile, netnsPath, target string) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	defer l.Close()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	if err := os.WriteFile(portFile+".tmp", []byte(port), 0o644); err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	if err := os.Rename(portFile+".tmp", portFile); err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	netns, err := ns.GetNS(netnsPath)
	if err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	defer netns.Close()
	for {
		c, err := l.Accept()
		if err != nil {
			return fmt.Errorf("forward: %w", err)
		}
		go splice(ctx, c, netns, target)
	}
}

func splice(ctx context.Context, c net.Conn, netns ns.NetNS, target string) {
	defer c.Close()
	var up net.Conn
	err := netns.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: 10 * time.Second}
		var err error
		up, err = d.DialContext(ctx, "tcp", target)
		return err
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "forward: dial %s: %v\n", target, err)
		return
	}
	defer up.Close()
	var wg sync.WaitGroup
	wg.Add(2)
	half := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}
	go half(up, c)
	go half(c, up)
	wg.Wait()
}

// waitPortFile waits for the forwarder's port file.
func waitPortFile(path string, timeout time.Duration) (string, error) {
	for end := time.Now().Add(timeout); ; {
		b, err := os.ReadFile(path)
		if err == nil && strings.TrimSpace(string(b)) != "" {
			return strings.TrimSpace(string(b)), nil
		}
		if time.Now().After(end) {
			return "", fmt.Errorf("kubecluster: the forwarder wrote no port to %s", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
