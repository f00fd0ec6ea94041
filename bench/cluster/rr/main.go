// Command rr is bench/cluster's request/response tool: a TCP server that
// answers every 1-byte request with 1 byte, and two clients that time it.
//
//	rr server [-addr :7000]                     serve until killed
//	rr rr  -addr HOST:PORT [-d 5s]              one connection, one request at a time
//	rr crr -addr HOST:PORT [-d 5s]              a new connection for every request
//	rr idle                                     wait until killed
//
// The clients print one JSON object: the transactions done, their rate
// per second and the 50th and 99th percentiles of their round-trip times in
// microseconds (for crr: connect, request, response and close).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: rr server|rr|crr|idle [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	addr := fs.String("addr", ":7000", "server address (server: to listen on)")
	d := fs.Duration("d", 5*time.Second, "how long the client runs")
	_ = fs.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "server":
		err = serve(*addr)
	case "rr":
		err = client(*addr, *d, false)
	case "crr":
		err = client(*addr, *d, true)
	case "idle":
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rr:", err)
		os.Exit(1)
	}
}

func serve(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go echo(c)
	}
}

// echo answers each byte read with one byte until the peer closes.
func echo(c net.Conn) {
	defer c.Close()
	b := make([]byte, 1)
	for {
		if _, err := io.ReadFull(c, b); err != nil {
			return
		}
		if _, err := c.Write(b); err != nil {
			return
		}
	}
}

// result is what a client prints.
type result struct {
	N     int     `json:"n"`
	Rate  float64 `json:"rate"`
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
}

func client(addr string, d time.Duration, newConn bool) error {
	var rtts []time.Duration
	var c net.Conn
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	b := []byte{1}
	start := time.Now()
	for time.Since(start) < d {
		t0 := time.Now()
		if c == nil {
			var err error
			if c, err = net.Dial("tcp", addr); err != nil {
				return err
			}
		}
		if err := exchange(c, b); err != nil {
			return err
		}
		if newConn {
			c.Close()
			c = nil
		}
		rtts = append(rtts, time.Since(t0))
	}
	if len(rtts) == 0 {
		return errors.New("no transaction")
	}
	slices.Sort(rtts)
	pct := func(p float64) float64 {
		return float64(rtts[min(len(rtts)-1, int(p*float64(len(rtts))))]) / 1e3
	}
	return json.NewEncoder(os.Stdout).Encode(result{N: len(rtts), Rate: float64(len(rtts)) / time.Since(start).Seconds(),
		P50us: pct(0.50), P99us: pct(0.99)})
}

func exchange(c net.Conn, b []byte) error {
	if _, err := c.Write(b); err != nil {
		return err
	}
	_, err := io.ReadFull(c, b)
	return err
}
