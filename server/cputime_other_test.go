//go:build !unix

package server_test

import "time"

// cpuTime is 0 where getrusage is not: cpu-ns/op reads 0.
func cpuTime() time.Duration { return 0 }
