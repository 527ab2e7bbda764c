// Package guardwire holds the messages between an upstream's guard
// (package upstream) and the store that the guards of every instance share
// (package store, in Redis): neither package imports the other.
package guardwire

import "time"

// Admit asks the shared guard to admit an attempt (store's admitScript).
type Admit struct {
	Now      time.Time     // zero: Redis's clock
	Interval time.Duration // between rate-limit slots; 0: no limit
	Tau      time.Duration // how far ahead of the schedule a slot may be
	MaxWait  time.Duration // the latest start of a slot booked
	Probes   int           // half-open probe slots
	Lease    time.Duration // of a half-open probe slot
	TTL      time.Duration // of the guard's hash
}

// Admission is the shared guard's answer to an Admit.
type Admission struct {
	Verdict string        // "ok", "open" or "limited"
	Wait    time.Duration // until the slot starts; open: until half-open, when known
	Gen     int64         // the breaker generation the attempt belongs to
	Changed string        // "half" when the breaker turned half-open; else ""
	Probe   int           // half-open probe slot held, 1-based; 0: none
	Backoff time.Duration // how much of Wait is the upstream's backoff
}

// Record tells the shared guard an attempt's outcome (store's
// recordScript).
type Record struct {
	Now              time.Time // zero: Redis's clock
	Outcome          string    // "s" (success), "f" (failure) or "n" (nothing learnt)
	Gen              int64
	Probe            int
	Backoff          time.Duration // the upstream asked for; 0: none
	FailureThreshold int
	FailureRate      float64
	MinRequests      int
	Window, OpenFor  time.Duration
	CloseAfter       int
	Probes           int
	TTL              time.Duration // of the guard's hash
}

// GuardState is the shared guard of one upstream as a status page shows
// it, its times measured from now by Redis's clock (or the one passed).
type GuardState struct {
	// Breaker is "closed", "half" (half-open) or "open".
	Breaker string
	// Until is, while open, how long until the breaker turns half-open;
	// else 0.
	Until time.Duration
	// TAT is the rate limit's theoretical arrival time of the next
	// request, from now: negative when the limit has been idle.
	TAT time.Duration
	// Backoff is how long the backoff the upstream asked for (Retry-After)
	// still holds every slot; 0: none.
	Backoff time.Duration
}

// Acquire asks the shared semaphore of one upstream's credential scope
// for a slot in flight (store's acquireSlotScript), waiting up to MaxWait
// for one to free.
type Acquire struct {
	Now     func() time.Time // nil: Redis's clock
	Max     int              // slots in flight at most, across every instance; at least 1
	Lease   time.Duration    // how long a slot is held unless released first
	MaxWait time.Duration    // how long to wait for a slot; 0: take one only if free now
	// Waiting, when set, is called once, when the first try finds every
	// slot taken and the caller is to wait: held is the slots taken, wait
	// how long until the earliest lease ends.
	Waiting func(held int, wait time.Duration)
}

// Slot is the shared semaphore's answer to an Acquire.
type Slot struct {
	// Token names the slot held, for its release; "" when none was taken
	// within MaxWait.
	Token string
	// Held is how many slots were taken, this one included, at the last
	// try.
	Held int
	// Wait is, when no slot was taken, how long until the earliest lease
	// ends (a hint for Retry-After); else 0.
	Wait time.Duration
}

// Release gives a slot in flight back (store's releaseSlotScript).
type Release struct {
	Now   time.Time // zero: Redis's clock
	Token string    // Slot.Token
	Max   int       // as in the Acquire: a release wakes waiters only when every slot was taken
}

// InFlight is what one upstream's shared semaphores hold, as a status
// page shows it: the live slots of each credential scope ("" for the
// fetches without a credential) that holds one.
type InFlight map[string]int
