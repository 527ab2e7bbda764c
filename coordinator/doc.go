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
//  4. run runs the flight's fill in a goroutine of its own; a panic
//     becomes an error for every caller, logged with its stack (coordinator.go).
//  5. fill reads L2 and the key's generation in one round trip
//     (store.Redis.GetDoc); a fresh copy there answers the flight.
//  6. fill registers for the key's completion events, then asks for the
//     key's fill lock (store.Redis.Register, store.Redis.TryLock).
//  7. Holding it, lead checks L2 once more (recheck), then fetches
//     through the upstream's guard: breaker, rate limit, Retry-After,
//     retries, redirects (fetch; package upstream).
//  8. Another instance holding it, follow re-checks L2 and waits for that
//     instance's push, or for its lease to lapse, to take over.
//  9. document turns the answer into a Document with its lifetime from
//     Cache-Control (package document).
//  10. lead stores it in L1 and answers this instance's callers (deliver);
//     a failure answers them with the flight's fallback, if any, for
//     stale-if-error (failed).
//  11. landRemote stores it in L2, releases the lock and publishes done in
//     one script, fenced against Invalidate (store.Redis.Land).
//  12. Each follower elsewhere is woken by the push, takes the document
//     from the event (small ones come inline) or from L2, and answers its
//     own callers; a failure is pushed too (store.Lease.HandOff).
//
// With a nil Redis client the Coordinator runs in single-node mode: the
// same flights, without steps 5, 6, 8, 11 and 12.
//
// # Files
//
//	coordinator.go  Coordinator, New, Get, wait, join, run, fill, follow, lead, Invalidate
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
// and the packages it composes, each knowing nothing of flights:
//
//	document  Document, its encoding, header checks, freshness (RFC 5861)
//	l1        the in-memory tier (bigcache)
//	store     everything in Redis: L2, fill locks, events, shared guards
//	upstream  fetches and the guard that protects each upstream
package coordinator
