// Package freeport hands tests a loopback address that is free now and
// unlikely to be taken before the code under test binds it.
//
// Asking the kernel for port 0 and closing the listener gives a port from
// the ephemeral range, which the kernel hands out next as the local port
// of outgoing connections (to Redis, to the upstream, between instances):
// on a busy machine one of them takes it before the server binds it
// ("address already in use"). Ports are therefore drawn at random below
// that range, which the kernel never assigns by itself, checked free by
// binding them, and never handed out twice by one process.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
)

var (
	mu    sync.Mutex
	given = map[int]bool{}
)

// lowest is the first port drawn; ports below it are often services'.
const lowest = 10000

// Addr returns "127.0.0.1:PORT" for a port free now.
func Addr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", Port(t))
}

// Port returns a loopback port free now.
func Port(t testing.TB) int {
	t.Helper()
	high := ephemeralLow()
	mu.Lock()
	defer mu.Unlock()
	for range 1000 {
		p := lowest + rand.IntN(high-lowest)
		if given[p] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue // in use
		}
		l.Close()
		given[p] = true
		return p
	}
	t.Fatalf("freeport: no free port in [%d, %d) after 1000 draws", lowest, high)
	return 0
}

// ephemeralLow is the first port of the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), 32768 where it cannot be read.
func ephemeralLow() int {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var lo, hi int
		if n, _ := fmt.Sscan(string(b), &lo, &hi); n == 2 && lo > lowest+1000 {
			low = lo
		}
	}
	return low
}
