// Package enginetest holds test seams for the coordinator package that its
// public API does not carry: a Recorder of the events that tests and
// cmd/coordbench count, and the helpers of tests that drive the engine
// directly (Protected, New, Get, SyncBuffer), and the waits of tests on
// the engine's observable state (Poll, Joined, AwaitJoined, WaitFor).
package enginetest

import (
	"sync/atomic"

	"github.com/coordd/coordd/coordinator"
)

// Recorder is a coordinator.Metrics that counts the events tests assert
// on, and passes every event on to its Metrics. Install it as Options.Metrics of
// one Coordinator; its counts are then that instance's. It is safe for
// concurrent use.
type Recorder struct {
	// Metrics receives every event too: say, the Prometheus registry of
	// an instance that serves metrics.
	coordinator.Metrics

	fetches      atomic.Int64
	timerWakeups atomic.Int64
	redisDowns   atomic.Int64
	flights      atomic.Int64
}

var _ coordinator.Metrics = (*Recorder)(nil)

// NewRecorder returns a Recorder that passes events on to next (nil:
// nowhere).
func NewRecorder(next coordinator.Metrics) *Recorder {
	if next == nil {
		next = coordinator.NopMetrics{}
	}
	return &Recorder{Metrics: next}
}

// Fetches returns how many upstream fetches the instance started, retries
// not counted: the number of times a flight led.
func (r *Recorder) Fetches() int64 { return r.fetches.Load() }

// TimerWakeups returns how many times a follower re-checked because the
// lock lease ran out rather than because it was pushed an event. Without
// a dead lock holder or a broken subscription it stays 0: every wakeup is
// a push.
func (r *Recorder) TimerWakeups() int64 { return r.timerWakeups.Load() }

// RedisDowns returns how many times the instance marked Redis down.
func (r *Recorder) RedisDowns() int64 { return r.redisDowns.Load() }

// RunningFlights returns how many flights the instance runs
// (coordd_flights).
func (r *Recorder) RunningFlights() int64 { return r.flights.Load() }

// Fetch implements coordinator.Metrics.
func (r *Recorder) Fetch(upstream string) {
	r.fetches.Add(1)
	r.Metrics.Fetch(upstream)
}

// TimerWakeup implements coordinator.Metrics.
func (r *Recorder) TimerWakeup() {
	r.timerWakeups.Add(1)
	r.Metrics.TimerWakeup()
}

// RedisHealth implements coordinator.Metrics.
func (r *Recorder) RedisHealth(up bool) {
	if !up {
		r.redisDowns.Add(1)
	}
	r.Metrics.RedisHealth(up)
}

// Flights implements coordinator.Metrics.
func (r *Recorder) Flights(delta int) {
	r.flights.Add(int64(delta))
	r.Metrics.Flights(delta)
}
