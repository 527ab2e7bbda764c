// Package coordinator is coordd's engine: it fills a two-tier cache (L1 in
// memory, L2 in Redis) from operator-configured upstreams so that, for a
// cold key, exactly one request reaches the upstream across every instance
// sharing the Redis, and every other caller gets the same bytes pushed to
// it when they land. It knows nothing of gRPC; package server translates.
//
// # The cold path
//
// A Get of a key that no tier holds, on one of several instances:
//
//  1. ResolveIn validates the url and key, canonicalizes the url and finds
//     its upstream and cache id (target.go, scope.go, document.ID).
//  2. Get looks in L1 (package l1); a fresh copy answers at once, a stale
//     one is served while it is refreshed (coordinator.go).
//  3. join makes the call a caller of this instance's flight of the key,
//     starting one if none runs: one fill per key per instance (flight.go).
//  4. run runs the flight's fill in a goroutine of its own, and is the one
//     place where a flight finishes: it answers the callers with what fill
//     returns, then lands the document for the other instances when fill
//     left that for after; a panic becomes an error for every caller,
//     logged with its stack (coordinator.go).
//  5. fill claims the key's fill lock, watching its pushes first, and
//     reads L2 and the key's generation in the same round trip
//     (coordination.claim); the first claim peeks: a copy in L2 comes
//     back without the lock, and a fresh one answers the flight.
//  6. Otherwise the claim is a lease to lead under, or a holder to
//     follow, with L2 as it was when the lock was looked at.
//  7. Holding a lease, lead looks at that copy (recheck), then fetches
//     through the upstream's guard: breaker, rate limit, Retry-After,
//     retries, redirects (fetch; package upstream).
//  8. Another instance holding it, follow looks at that copy and waits
//     for that instance's push, or for its lease to lapse, to take over.
//  9. document turns the answer into a Document with its lifetime from
//     Cache-Control (package document).
//  10. deliver stores it in L1; run answers this instance's callers; a
//     failure answers them with the flight's fallback, if any, for
//     stale-if-error (failed).
//  11. landRemote stores it in L2, releases the lock and publishes done in
//     one script, fenced against Invalidate (lease.land).
//  12. Each follower elsewhere is woken by the push, takes the document
//     from the event (small ones come inline) or from L2, and answers its
//     own callers; a failure is pushed too (lease.handOff).
//
// # Modes
//
// What a flight shares with other instances goes through coordination
// (coordination.go), which has two implementations: inProcess, with a nil
// Redis client (single-node mode: no L2, every flight leads under a
// localLease that binds nobody else), and shared (shared.go), over Redis.
// While Redis does not answer, shared's claim falls back to this instance
// alone (a degraded claim): its remoteLease still lands fenced by the
// generation and still wakes whoever waits on its token. The engine has
// no other branch on the mode.
//
// # Files
//
//	coordinator.go  Coordinator, New, Get, wait, join, run, fill, follow, lead, Invalidate
//	coordination.go coordination, lease, and single-node mode (inProcess)
//	shared.go       coordination through Redis, and its fallback while Redis is down
//	flight.go       one fill of one key in this instance, and its callers
//	target.go       Target, Resolve: validated urls and keys, flight keys,
//	                and which document serves which target
//	scope.go        tenants and the upstreams they may use
//	progress.go     Progress, Role, Stage, Source, Result
//	errors.go       sentinel errors
//	metrics.go      the Metrics interface and status accessors
//	status.go       Status: a read-only snapshot for a status page
//	window.go       the rolling counts behind Status
//	config.go       Config, its defaults and validation
//	trace.go        OpenTelemetry spans of flights, locks, fetches and landings (Options.TracerProvider)
//
// and the packages it composes, each knowing nothing of flights, under
// the module's internal/ (importable by this module only):
//
//	document   Document, its encoding, header checks, freshness (RFC 5861)
//	l1         the in-memory tier (bigcache)
//	store      everything in Redis: L2, fill locks, events, shared guards
//	upstream   fetches and the guard that protects each upstream
//	guardwire  the messages between an upstream's guard and the store
//	observe    the Metrics interface and its no-op, and Stage
package coordinator
