package store

import (
	"context"
	"testing"
	"time"
)

// oneSlotAsk asks for a slot of a rate limit of one a second, burst one,
// on a fixed clock: a second slot booked shows as a wait of 2s.
func oneSlotAsk(now time.Time) *AdmitAsk {
	return &AdmitAsk{Upstream: "up", Admit: Admit{Now: now, Interval: time.Second, MaxWait: time.Minute, TTL: time.Minute}}
}

// TestClaimAdmitting: the claim that takes the lock is admitted in the
// same round trip; a claim that finds the lock held, or a copy in L2 with
// peek, books nothing. In Redis Cluster the guard's keys are in another
// slot: the claim takes the lock alone and the holder asks Admit after.
func TestClaimAdmitting(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			a, _ := startStore(t, be.client(t))
			b, _ := startStore(t, be.client(t))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			now := time.Now()
			const id = "https://example.org/claim-admit"
			c := a.ClaimAdmitting(ctx, id, time.Minute, true, oneSlotAsk(now))
			if c.Err != nil || c.Lease == nil {
				t.Fatalf("ClaimAdmitting = %+v; want the lock", c)
			}
			defer c.Lease.StopWatchdog()
			cluster := be.name == "cluster"
			switch {
			case cluster && c.Admission != nil:
				t.Fatalf("Admission = %+v; want none in Redis Cluster", *c.Admission)
			case !cluster && (c.Admission == nil || c.Admission.Verdict != "ok" || c.Admission.Wait != 0):
				t.Fatalf("Admission = %+v; want ok at once", c.Admission)
			}
			// Another instance finds the lock held, and books nothing.
			f := b.ClaimAdmitting(ctx, id, time.Minute, true, oneSlotAsk(now))
			if f.Err != nil || f.Lease != nil || f.Holder.Token != c.Lease.Token() || f.Admission != nil {
				t.Fatalf("second ClaimAdmitting = %+v; want a's lock held, no admission", f)
			}
			// One with peek that finds a copy in L2 books nothing either.
			const other = "https://example.org/claim-admit-found"
			l, _, err := b.TryLock(ctx, other, time.Minute)
			if err != nil || l == nil {
				t.Fatalf("TryLock = %v, %v", l, err)
			}
			_, enc := doc(other, "body")
			if landed, err := b.Land(l, other, "", enc, time.Hour, true); err != nil || !landed {
				t.Fatalf("Land = %v, %v", landed, err)
			}
			if g := a.ClaimAdmitting(ctx, other, time.Minute, true, oneSlotAsk(now)); !g.Found || g.Admission != nil {
				t.Fatalf("ClaimAdmitting with a copy in L2 = %+v; want found, no admission", g)
			}
			// The one slot booked so far is the lock holder's (none in
			// Cluster, whose holder asks after): the next is a second away.
			want := time.Second
			if cluster {
				want = 0
			}
			if got, err := b.Admit(ctx, "up", oneSlotAsk(now).Admit); err != nil || got.Verdict != "ok" || got.Wait != want {
				t.Fatalf("Admit = %+v, %v; want ok in %v: one slot booked before", got, err, want)
			}
		})
	}
}

// TestReplayedClaimAdmitting: go-redis replays the claim whose reply was
// lost with its connection. The replay finds the lock held by its own
// token and answers the admission the first run made, from its receipt,
// instead of booking a second slot.
func TestReplayedClaimAdmitting(t *testing.T) {
	fl := startReplayFleet(t)
	now := time.Now()
	const id = "https://example.org/replayed-claim-admit"
	dropped := fl.proxy.DropNext(claimAdmitScript.Hash(), fl.a.lockKey(id))
	c := fl.a.ClaimAdmitting(fl.ctx, id, time.Minute, true, oneSlotAsk(now))
	waitFired(t, dropped)
	if c.Err != nil || c.Lease == nil || c.Admission == nil || c.Admission.Verdict != "ok" || c.Admission.Wait != 0 {
		t.Fatalf("ClaimAdmitting = %+v (admission %+v); want the lock and the first run's slot, at once", c, c.Admission)
	}
	defer c.Lease.StopWatchdog()
	if h, err := fl.b.HolderOf(fl.ctx, id); err != nil || h.Token != c.Lease.Token() {
		t.Fatalf("HolderOf = %+v, %v; want the lease's token", h, err)
	}
	if got, err := fl.b.Admit(fl.ctx, "up", oneSlotAsk(now).Admit); err != nil || got.Verdict != "ok" || got.Wait != time.Second {
		t.Fatalf("Admit = %+v, %v; want ok in 1s: the replay booked no second slot", got, err)
	}
}
