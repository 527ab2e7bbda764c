// Package l1 is coordd's in-memory tier: documents by cache id, bounded
// in bytes, shared without copies while they are alive.
package l1

import (
	"context"
	"hash/fnv"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/allegro/bigcache/v3"

	"github.com/coordd/coordd/internal/document"
)

// Cache is the in-memory tier: a bigcache bounded in bytes, plus a map of
// weak pointers to the Documents currently alive in this process. The weak
// map lets a hit share the very buffer that the flight, or another caller
// still streaming it, already holds, instead of copying it out of bigcache
// again; it holds no memory of its own beyond what callers keep alive.
// A Cache is safe for concurrent use.
type Cache struct {
	bc *bigcache.BigCache

	// documentBytes is the size of the encodings bc holds: added by Set
	// once bc took one, taken off by bc's remove callback (evicted,
	// expired, deleted), so it is exact once neither is in progress (but
	// for two ids whose 64-bit hashes collide, whose copies bigcache
	// swaps without a callback).
	documentBytes atomic.Int64
	evicted       atomic.Int64 // dropped to make room
	expired       atomic.Int64 // dropped past the life window

	stripes [64]sync.Mutex // order each id's Set and Delete (stripe)

	mu  sync.Mutex // protects hot
	hot map[string]weak.Pointer[document.Document]
}

// New returns a Cache of at most maxBytes, holding documents of up to
// maxEntry bytes for at most life.
func New(maxBytes, maxEntry int64, life time.Duration) (*Cache, error) {
	// bigcache refuses entries larger than one shard, so pick the most
	// shards (a power of two, at most 1024) that still fit two of the
	// largest documents each.
	shards := 1024
	for shards > 1 && maxBytes/int64(shards) < 2*(maxEntry+4096) {
		shards >>= 1
	}
	if bits.OnesCount(uint(shards)) != 1 {
		shards = 1
	}
	cfg := bigcache.DefaultConfig(life)
	cfg.Shards = shards
	cfg.CleanWindow = time.Minute
	cfg.MaxEntriesInWindow = 1024
	cfg.MaxEntrySize = 16 << 10
	cfg.HardMaxCacheSize = int(max(1, maxBytes>>20))
	cfg.Verbose = false
	cfg.Logger = nil
	l := &Cache{hot: make(map[string]weak.Pointer[document.Document])}
	// bigcache hands the callback a copy of the entry: one copy per
	// document dropped or replaced, on the Set or Delete that drops it (or
	// its cleaner), never on a hit.
	cfg.OnRemoveWithReason = func(_ string, entry []byte, why bigcache.RemoveReason) {
		l.documentBytes.Add(-int64(len(entry)))
		switch why {
		case bigcache.NoSpace:
			l.evicted.Add(1)
		case bigcache.Expired:
			l.expired.Add(1)
		}
	}
	cfg = cfg.OnRemoveFilterSet(bigcache.NoSpace, bigcache.Expired, bigcache.Deleted)
	bc, err := bigcache.New(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	l.bc = bc
	return l, nil
}

// Get returns the cached Document of cache id key, or nil.
func (l *Cache) Get(key string) *document.Document {
	l.mu.Lock()
	if d := l.hot[key].Value(); d != nil {
		l.mu.Unlock()
		return d
	}
	l.mu.Unlock()
	b, err := l.bc.Get(key)
	if err != nil {
		return nil
	}
	d, err := document.Decode(b)
	if err != nil || d.ID() != key {
		return nil
	}
	l.remember(d)
	return d
}

// Set stores d, whose encoding is enc, under its cache id, replacing any
// older copy, but not a newer one that is still alive in this process. enc
// is copied into bigcache; d keeps sharing its own body. The check and the
// store are one step for each id: of two Sets racing, the newer copy wins.
func (l *Cache) Set(d *document.Document, enc []byte) {
	id := d.ID()
	mu := l.stripe(id)
	mu.Lock()
	defer mu.Unlock()
	l.mu.Lock()
	cur := l.hot[id].Value()
	l.mu.Unlock()
	if cur != nil && cur.URL == d.URL && cur.FetchedAt.After(d.FetchedAt) {
		return
	}
	// bigcache's Set drops the copy it replaces without a callback, so
	// that copy's size could not be taken off documentBytes: Delete it
	// first, whose callback does. Hits find d in the weak map meanwhile.
	l.remember(d)
	_ = l.bc.Delete(id)
	if err := l.bc.Set(id, enc); err != nil {
		l.deleteLocked(id) // too large for a shard: never serve an older copy
		return
	}
	l.documentBytes.Add(int64(len(enc)))
}

// Delete removes key.
func (l *Cache) Delete(key string) {
	mu := l.stripe(key)
	mu.Lock()
	defer mu.Unlock()
	l.deleteLocked(key)
}

// deleteLocked is Delete, under key's stripe.
func (l *Cache) deleteLocked(key string) {
	l.mu.Lock()
	delete(l.hot, key)
	l.mu.Unlock()
	_ = l.bc.Delete(key)
}

// stripe is the lock that orders the Sets and Deletes of key: one of a
// fixed few, so that Sets of different documents rarely wait on each
// other while bigcache copies their bodies.
func (l *Cache) stripe(key string) *sync.Mutex {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return &l.stripes[h.Sum32()%uint32(len(l.stripes))]
}

func (l *Cache) remember(d *document.Document) {
	p, id := weak.Make(d), d.ID()
	l.mu.Lock()
	l.hot[id] = p
	l.mu.Unlock()
	runtime.AddCleanup(d, l.forget, id)
}

// forget drops key's weak entry once its Document has been collected,
// unless a newer Document has taken its place.
func (l *Cache) forget(key string) {
	l.mu.Lock()
	if p, ok := l.hot[key]; ok && p.Value() == nil {
		delete(l.hot, key)
	}
	l.mu.Unlock()
}

// Close releases the cache.
func (l *Cache) Close() error { return l.bc.Close() }

// Stats are a Cache's figures.
type Stats struct {
	Entries int // documents held
	// Bytes is the memory bigcache has allocated for them, up to the
	// Cache's bound. bigcache allocates its shards ahead of use, so with
	// few documents it is far above DocumentBytes.
	Bytes int64
	// DocumentBytes is the size of the documents held: the sum of their
	// encodings (header and body), as stored. It may lag a Set or Delete
	// in progress.
	DocumentBytes int64
	// Evicted counts documents dropped to make room; Expired, those
	// dropped past the life window.
	Evicted, Expired int64
}

// Stats returns the cache's figures.
func (l *Cache) Stats() Stats {
	return Stats{
		Entries: l.bc.Len(), Bytes: int64(l.bc.Capacity()), DocumentBytes: max(l.documentBytes.Load(), 0),
		Evicted: l.evicted.Load(), Expired: l.expired.Load(),
	}
}
