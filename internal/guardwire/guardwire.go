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
	// Quota, when set, has the attempt spend a learned quota: its
	// credential Scope's ("" none), in the partition its Route (the url's
	// first path segment) was last answered under, else Partition. Its
	// pacing floors the slot, and the slot books one request of it. Burst
	// is the slots of headroom the pacing allows; Background keeps the
	// window's reserve for fetches callers wait on.
	Quota                   bool
	Scope, Partition, Route string
	Burst                   int
	Background              bool
}

// Admission is the shared guard's answer to an Admit.
type Admission struct {
	Verdict string        // "ok", "open" or "limited"
	Wait    time.Duration // until the slot starts; open: until half-open, when known
	Gen     int64         // the breaker generation the attempt belongs to
	Changed string        // "half" when the breaker turned half-open; else ""
	Probe   int           // half-open probe slot held, 1-based; 0: none
	Backoff time.Duration // how much of Wait is the upstream's backoff
	Paced   time.Duration // how much of Wait the learned quota's pacing asks
	Unknown bool          // the attempt named a quota that no answer has announced yet
	// Slack is how late the slot may start and still be among its quota
	// window's slots; -1: no quota paces it.
	Slack time.Duration
	// RateLater: the learned quota paces the slot, and the rate limit is
	// not booked for it: the attempt asks the rate limit alone (an Admit
	// without Quota) when the slot starts. A slot booked ahead by one
	// credential's pacing would otherwise hold the rate limit, which
	// every credential of the upstream shares, until then.
	RateLater bool
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
	// Quota, when set, is what the answer announced of its quota.
	Quota *QuotaNote
}

// QuotaNote is a quota an answer announced (upstream.Quota), to learn
// into the hash of the credential Scope, for its Partition, which Route
// is then known to be counted in.
type QuotaNote struct {
	Scope     string
	Route     string
	Remaining int64         // at most Limit
	Limit     int64         // at least 1
	Reset     time.Duration // from the answer's arrival, 0 to MaxQuotaReset
	Partition string
	Source    string // the header it was read from
	Label     string // whose credential, for a status page
	// Unbooked: the request was admitted before its quota was known, so
	// no slot of the quota was booked for it (upstream's quotaNote).
	Unbooked bool
}

// MaxQuotaReset bounds a quota's reset that is believed: one further away
// is garbage (a clock in milliseconds, a year typed wrong), never a reason
// to stop calling the upstream for that long. The Go parser and the
// shared store's script both apply it; a QuotaNote outside its bounds
// (limit under 1, remaining over the limit, reset outside 0 to
// MaxQuotaReset) is learned by neither.
const MaxQuotaReset = 24 * time.Hour

// QuotaState is a learned quota as a status page shows it.
type QuotaState struct {
	Key       string // "scope|partition"; the scope is a keyed hash
	Label     string
	Partition string
	Source    string
	Limit     int64
	Remaining int64         // after the slots booked
	Reset     time.Duration // from now; 0 when the window is unknown
	Age       time.Duration // since the last announcement
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
	// Quotas are the quotas learned from the upstream's answers.
	Quotas []QuotaState
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

// The constants of the guard's arithmetic, defined once: the Go guard
// (package upstream) uses them as they are, and the Lua scripts (package
// store) get them spliced in as Lua constants (store's luaConsts), so
// that the two implementations FuzzBreakerGoVsLua and FuzzQuotaGoVsLua
// compare cannot drift apart on a copied number.
const (
	// BreakerBuckets is how many buckets the failure-rate window is cut
	// in (the hash's fields i0.., r0.., f0..).
	BreakerBuckets = 10
	// QuotaSlack is how much later a reset must be than the known one to
	// start a new quota window rather than restate the current one, and
	// the most a window's margin is.
	QuotaSlack = time.Second
	// QuotaMarginParts: a window's margin is its length over this, at most
	// QuotaSlack.
	QuotaMarginParts = 10
	// ReserveParts: background fetches never take the last limit over
	// this (at least one request) of a window.
	ReserveParts = 10
)
