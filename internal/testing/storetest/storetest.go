// Package storetest lets tests outside internal/store ask what the
// store keeps in Redis (is a fill lock held, and by whom; is a document
// stored), watch and send its events, and pick out one of its scripts'
// commands on the wire for redistest.Proxy, without spelling its key
// names, channels or scripts: those stay in the store, which is tested
// where it lives.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/internal/store"
)

// DefaultPrefix is the default of coordinator.Config.KeyPrefix, which
// every test that sets none runs with; a test in coordinator checks that
// they agree.
const DefaultPrefix = "coordd:"

// Event is a message on the store's completion channel.
type Event = store.Event

// Event types.
const (
	EventDone    = store.EventDone
	EventFail    = store.EventFail
	EventRelease = store.EventRelease
	EventInval   = store.EventInval
)

// Store is what a store with one key prefix keeps in one Redis
// deployment. It is safe for concurrent use.
type Store struct {
	rdb redis.UniversalClient
	l   store.Layout
}

// New looks at what a store of prefix ("": DefaultPrefix) keeps in rdb: a
// client of a single Redis, of a Redis Cluster, or of a Sentinel's
// master. rdb may be nil when only the Call methods are used.
func New(rdb redis.UniversalClient, prefix string) *Store {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Store{rdb: rdb, l: store.Layout{Prefix: prefix}}
}

// HolderToken returns the token of the lease holding id's fill lock; ""
// when it is free.
func (s *Store) HolderToken(ctx context.Context, id string) (string, error) {
	tok, err := s.rdb.Get(ctx, s.l.LockKey(id)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return tok, err
}

// LockHeld reports whether an instance holds id's fill lock.
func (s *Store) LockHeld(ctx context.Context, id string) (bool, error) {
	tok, err := s.HolderToken(ctx, id)
	return tok != "", err
}

// DocStored reports whether L2 holds a document of id.
func (s *Store) DocStored(ctx context.Context, id string) (bool, error) {
	n, err := s.rdb.Exists(ctx, s.l.DocKey(id)).Result()
	return n == 1, err
}

// SlotKey is a key in id's Redis Cluster slot, where all of id's keys
// are (for redistest.Cluster.MasterOf).
func (s *Store) SlotKey(id string) string { return s.l.LockKey(id) }

// ShardChannels are the shard channels the hubs subscribe to on a Redis
// Cluster, in shard order: channel i's slot is in [1024i, 1024i+1024).
func (s *Store) ShardChannels() []string { return s.l.ShardChannels() }

// Publish sends ev on the completion channel of a single Redis, as an
// instance would.
func (s *Store) Publish(ctx context.Context, ev Event) error {
	return s.rdb.Publish(ctx, s.l.Channel(), store.EncodeEvent(ev)).Err()
}

// Subscribe subscribes to the completion channel of a single Redis (rdb
// must be a client of one server, or of a Sentinel's master), and
// returns once Redis confirmed it.
func (s *Store) Subscribe(ctx context.Context) (*Events, error) {
	ps := s.rdb.Subscribe(ctx, s.l.Channel())
	if _, err := ps.Receive(ctx); err != nil { // the confirmation
		_ = ps.Close()
		return nil, err
	}
	return &Events{ps: ps, s: s}, nil
}

// Events is a subscription to the completion channel. Its methods must
// be called from one goroutine at a time; Close may be called from any.
type Events struct {
	ps *redis.PubSub
	s  *Store
}

// Close ends the subscription.
func (e *Events) Close() error { return e.ps.Close() }

// Next returns the next event published, skipping messages that are not
// events.
func (e *Events) Next(ctx context.Context) (Event, error) {
	for {
		m, err := e.ps.ReceiveMessage(ctx)
		if err != nil {
			return Event{}, err
		}
		if ev, ok := store.DecodeEvent(m.Payload); ok {
			return ev, nil
		}
	}
}

// Sync returns every event published before Sync was called and not
// yet returned by Next or Sync: it publishes a mark, which arrives after
// all of them, and reads up to it.
func (e *Events) Sync(ctx context.Context) ([]Event, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	mark := "storetest:mark:" + hex.EncodeToString(b[:])
	if err := e.s.rdb.Publish(ctx, e.s.l.Channel(), mark).Err(); err != nil {
		return nil, err
	}
	var evs []Event
	for {
		m, err := e.ps.ReceiveMessage(ctx)
		if err != nil {
			return nil, fmt.Errorf("storetest: waiting for mark: %w", err)
		}
		if m.Payload == mark {
			return evs, nil
		}
		if ev, ok := store.DecodeEvent(m.Payload); ok {
			evs = append(evs, ev)
		}
	}
}

// Calls pick out, in the RESP encoding of a command, one run of a script
// on an id's (or an upstream's) keys, for redistest.Proxy's DropNext and
// HoldNext. They name the script by its hash, so the script must run as
// EVALSHA: the store loads every script at start.

// LockCall picks out TryLock's run of the lock script on id.
func (s *Store) LockCall(id string) []string { return s.call("lock", s.l.LockKey(id)) }

// ClaimCall picks out a flight's claim of id on a single Redis, which
// asks upstream's guard to admit the fetch in the same script when it
// takes the lock (store's claimAdmitScript).
func (s *Store) ClaimCall(id, upstream string) []string {
	return append(s.call("lock+admit", s.l.LockKey(id)), s.l.GuardKey(upstream))
}

// HolderCall picks out HolderOf's run of the holder script on id.
func (s *Store) HolderCall(id string) []string { return s.call("holder", s.l.LockKey(id)) }

// ExtendCall picks out a watchdog's renewal of id's lease.
func (s *Store) ExtendCall(id string) []string { return s.call("extend", s.l.LockKey(id)) }

// LandCall picks out Land's run of the landing script on id.
func (s *Store) LandCall(id string) []string { return s.call("land", s.l.LockKey(id)) }

// HandOffCall picks out a lease's HandOff on id.
func (s *Store) HandOffCall(id string) []string { return s.call("handoff", s.l.LockKey(id)) }

// InvalidateCall picks out Invalidate's run on id.
func (s *Store) InvalidateCall(id string) []string { return s.call("invalidate", s.l.DocKey(id)) }

// AdmitCall picks out an admission by upstream's shared guard.
func (s *Store) AdmitCall(upstream string) []string { return s.call("admit", s.l.GuardKey(upstream)) }

// RecordCall picks out the record of an attempt's outcome in upstream's
// shared guard; failure: only the record of a failure.
func (s *Store) RecordCall(upstream string, failure bool) []string {
	c := s.call("record", s.l.GuardKey(upstream))
	if failure {
		c = append(c, "\r\n$1\r\nf\r\n") // the outcome, ARGV[2]: see store.Record
	}
	return c
}

func (s *Store) call(script, key string) []string {
	return []string{store.ScriptHash(script), key}
}
