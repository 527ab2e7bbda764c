package store

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestClaim: one round trip takes id's fill lock, or names its holder,
// and reads id's copy in L2 and its generation as it does; with peek, a
// copy in L2 is returned without the lock being taken. On a single Redis
// and on a Redis Cluster, where the keys share id's slot.
func TestClaim(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			in := startInstances(t, be)
			var trips atomic.Int64
			rdb := be.client(t)
			rdb.AddHook(countHook{&trips})
			c, _ := startStore(t, rdb)
			claim := func(id string, peek bool) Claim {
				t.Helper()
				trips.Store(0)
				cl := c.Claim(in.ctx, id, in.leaseTTL, peek)
				if cl.Err != nil {
					t.Fatalf("Claim(%s, peek %v): %v", id, peek, cl.Err)
				}
				if n := trips.Load(); n != 1 {
					t.Fatalf("Claim(%s, peek %v): %d round trips; want 1", id, peek, n)
				}
				if cl.Lease != nil {
					t.Cleanup(cl.Lease.StopWatchdog)
				}
				return cl
			}

			const id = "https://example.org/claim"
			cl := claim(id, true) // cold: nothing to peek at, the lock is taken
			if cl.Lease == nil || cl.Found || cl.Doc != nil || cl.Gen != "" {
				t.Fatalf("cold claim = %+v; want the lease, no copy, generation \"\"", cl)
			}
			got, h, err := in.b.TryLock(in.ctx, id, in.leaseTTL) // b is told who holds it
			if err != nil || got != nil || h.Token != cl.Lease.Token() || h.Left <= 0 {
				t.Fatalf("TryLock = %v, %+v, %v; want the holder %s", got, h, err, cl.Lease.Token())
			}
			_, enc := doc(id, "claimed")
			if landed, err := c.Land(cl.Lease, id, cl.Gen, enc, in.leaseTTL, true); err != nil || !landed {
				t.Fatalf("Land = %v, %v", landed, err)
			}

			cl = claim(id, true) // warm: the copy, and the lock left alone
			if !cl.Found || cl.Lease != nil || cl.Doc == nil || !bytes.Equal(cl.Enc, enc) || cl.Gen != "" {
				t.Fatalf("warm peek = %+v; want the copy found, no lease", cl)
			}
			if h := in.holder(t, id); h != "" {
				t.Fatalf("holder after a peek that found a copy = %q; want none", h)
			}

			held := in.lock(t, in.a, id) // contended: the holder, and the copy as the lock was looked at
			cl = claim(id, false)
			if cl.Lease != nil || cl.Found || cl.Holder.Token != held.Token() || !bytes.Equal(cl.Enc, enc) {
				t.Fatalf("contended claim = %+v; want a's lease named, and the copy", cl)
			}
			held.HandOff(Event{Type: EventRelease})

			if _, err := in.a.Invalidate(in.ctx, id, in.invalidTTL); err != nil {
				t.Fatal(err)
			}
			cl = claim(id, false) // the generation Invalidate bumped
			if cl.Lease == nil || cl.Doc != nil || cl.Gen != in.gen(t, id) || cl.Gen == "" {
				t.Fatalf("claim after Invalidate = %+v; want the lease, no copy, generation %q", cl, in.gen(t, id))
			}
		})
	}
}

// countHook counts the commands and pipelines a client sends.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "ping" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}
