package store

import (
	"context"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/testing/redistest"
)

// Every script may run twice: go-redis replays a command whose connection
// dropped before its reply came back (MaxRetries). These tests drop the
// reply of one run of each script, picked out on the wire by the script's
// hash and its key, and check that the replay answers what the first run
// did and changes nothing more.

// replayFleet is store a reaching Redis through a proxy that drops
// replies on demand, and store b reaching it directly.
type replayFleet struct {
	rs     *redistest.Server
	proxy  *redistest.Proxy
	a, b   *Redis
	ma, mb *recorder
	events *eventLog
	ctx    context.Context
}

func startReplayFleet(t *testing.T, tune ...func(*Config)) *replayFleet {
	t.Helper()
	fl := &replayFleet{rs: redistest.Start(t)}
	loadScripts(t, fl.rs)
	fl.proxy = redistest.StartProxy(t, fl.rs.Addr())
	fl.a, fl.ma = startStore(t, proxyClient(t, fl.proxy), tune...)
	fl.b, fl.mb = startStore(t, fl.rs.Client(t), tune...)
	fl.events = watchEvents(t, fl.rs, fl.a)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	fl.ctx = ctx
	return fl
}

// TestReplayAfterLostReply: for each script, a run whose reply is lost
// with its connection, and go-redis's replay of it.
func TestReplayAfterLostReply(t *testing.T) {
	t.Run("lock", func(t *testing.T) {
		// The replay finds the lock held by the first run's token: that is
		// this lease, not another holder's.
		fl := startReplayFleet(t)
		const id = "https://example.org/replayed-lock"
		dropped := fl.proxy.DropNext(lockScript.Hash(), fl.a.lockKey(id))
		l, h, err := fl.a.TryLock(fl.ctx, id, time.Minute)
		waitFired(t, dropped)
		if err != nil || l == nil || h.Token != "" {
			t.Fatalf("TryLock = %v, %+v, %v; want the lease the first run took", l, h, err)
		}
		defer l.StopWatchdog()
		if got, err := fl.b.HolderOf(fl.ctx, id); err != nil || got.Token != l.Token() {
			t.Fatalf("HolderOf = %+v, %v; want the lease's token", got, err)
		}
		if a, c := fl.ma.count("lock acquired"), fl.ma.count("lock contended"); a != 1 || c != 0 {
			t.Fatalf("acquired %d, contended %d; want acquired once", a, c)
		}
	})
	t.Run("holder", func(t *testing.T) {
		fl := startReplayFleet(t)
		const id = "https://example.org/replayed-holder"
		l, _, err := fl.b.TryLock(fl.ctx, id, time.Minute)
		if err != nil || l == nil {
			t.Fatalf("TryLock = %v, %v", l, err)
		}
		defer l.StopWatchdog()
		dropped := fl.proxy.DropNext(holderScript.Hash(), fl.a.lockKey(id))
		h, err := fl.a.HolderOf(fl.ctx, id)
		waitFired(t, dropped)
		if err != nil || h.Token != l.Token() || h.Left <= 0 {
			t.Fatalf("HolderOf = %+v, %v; want b's lease", h, err)
		}
	})
	t.Run("extend", func(t *testing.T) {
		// The replay extends again: idempotent, the lease is kept.
		fl := startReplayFleet(t)
		const id = "https://example.org/replayed-extend"
		dropped := fl.proxy.DropNext(extendScript.Hash(), fl.a.lockKey(id))
		l, _, err := fl.a.TryLock(fl.ctx, id, 600*time.Millisecond)
		if err != nil || l == nil {
			t.Fatalf("TryLock = %v, %v", l, err)
		}
		defer l.StopWatchdog()
		waitFired(t, dropped)
		fl.ma.waitCount(t, "extension ok", 3) // the replayed renewal, then two more
		if n := fl.ma.count("extension lost") + fl.ma.count("extension error"); n != 0 {
			t.Fatalf("%d failed renewals; want none", n)
		}
		if h, err := fl.b.HolderOf(fl.ctx, id); err != nil || h.Token != l.Token() {
			t.Fatalf("HolderOf = %+v, %v; want the lease, renewed", h, err)
		}
	})
	t.Run("land", func(t *testing.T) {
		// The replay answers "landed", and neither stores nor publishes
		// again: without its receipt it would land a second time (the
		// generation still matches) and announce it twice.
		fl := startReplayFleet(t)
		const id = "https://example.org/replayed-land"
		l, _, err := fl.a.TryLock(fl.ctx, id, time.Minute)
		if err != nil || l == nil {
			t.Fatalf("TryLock = %v, %v", l, err)
		}
		_, enc := doc(id, "body")
		dropped := fl.proxy.DropNext(landScript.Hash(), fl.a.lockKey(id))
		landed, err := fl.a.Land(l, id, "", enc, time.Hour, true)
		waitFired(t, dropped)
		if err != nil || !landed {
			t.Fatalf("Land = %v, %v; want landed", landed, err)
		}
		if n := fl.events.count(t, EventDone, id); n != 1 {
			t.Fatalf("%d done events; want 1 (the replay published again)", n)
		}
		if d, _, _ := fl.b.GetDoc(fl.ctx, id); d == nil {
			t.Fatal("document not in L2")
		}
		if h, err := fl.b.HolderOf(fl.ctx, id); err != nil || h.Token != "" {
			t.Fatalf("HolderOf = %+v, %v; want the lock released", h, err)
		}
	})
	t.Run("land refused", func(t *testing.T) {
		// A fenced landing's replay is refused too, and announces nothing.
		fl := startReplayFleet(t)
		const id = "https://example.org/replayed-refusal"
		l, _, err := fl.a.TryLock(fl.ctx, id, time.Minute)
		if err != nil || l == nil {
			t.Fatalf("TryLock = %v, %v", l, err)
		}
		if _, err := fl.b.Invalidate(fl.ctx, id, time.Minute); err != nil {
			t.Fatal(err)
		}
		_, enc := doc(id, "body")
		dropped := fl.proxy.DropNext(landScript.Hash(), fl.a.lockKey(id))
		landed, err := fl.a.Land(l, id, "", enc, time.Hour, true)
		waitFired(t, dropped)
		if err != nil || landed {
			t.Fatalf("Land = %v, %v; want refused", landed, err)
		}
		if n := fl.events.count(t, EventDone, id); n != 0 {
			t.Fatalf("%d done events; want none", n)
		}
	})
	t.Run("handoff", func(t *testing.T) {
		// The replay publishes no second fail.
		fl := startReplayFleet(t)
		const id = "https://example.org/replayed-handoff"
		l, _, err := fl.a.TryLock(fl.ctx, id, time.Minute)
		if err != nil || l == nil {
			t.Fatalf("TryLock = %v, %v", l, err)
		}
		w := fl.b.Register(id)
		defer fl.b.Unregister(w)
		dropped := fl.proxy.DropNext(handOffScript.Hash(), fl.a.lockKey(id))
		l.HandOff(Event{Type: EventFail, Kind: "unavailable", Msg: "upstream down"})
		waitFired(t, dropped)
		if ev := nextOf(t, w, EventFail); ev.Token != l.Token() {
			t.Fatalf("fail event %+v; want the lease's token", ev)
		}
		if n := fl.events.count(t, EventFail, id); n != 1 {
			t.Fatalf("%d fail events; want 1 (the replay published again)", n)
		}
		if h, err := fl.b.HolderOf(fl.ctx, id); err != nil || h.Token != "" {
			t.Fatalf("HolderOf = %+v, %v; want the lock released", h, err)
		}
	})
	t.Run("invalidate", func(t *testing.T) {
		// The replay answers what the first run found (the document
		// existed, which the first run deleted), bumps the generation
		// once, and publishes no second inval.
		fl := startReplayFleet(t)
		const id = "https://example.org/replayed-invalidate"
		l, _, err := fl.b.TryLock(fl.ctx, id, time.Minute)
		if err != nil || l == nil {
			t.Fatalf("TryLock = %v, %v", l, err)
		}
		_, enc := doc(id, "body")
		if landed, err := fl.b.Land(l, id, "", enc, time.Hour, true); err != nil || !landed {
			t.Fatalf("Land = %v, %v", landed, err)
		}
		dropped := fl.proxy.DropNext(invalidateScript.Hash(), fl.a.docKey(id))
		existed, err := fl.a.Invalidate(fl.ctx, id, time.Minute)
		waitFired(t, dropped)
		if err != nil || !existed {
			t.Fatalf("Invalidate = %v, %v; want existed: the first run deleted the document", existed, err)
		}
		if _, _, gen := fl.b.GetDoc(fl.ctx, id); gen != "1" {
			t.Fatalf("generation %q; want 1: bumped once", gen)
		}
		if n := fl.events.count(t, EventInval, id); n != 1 {
			t.Fatalf("%d inval events; want 1 (the replay published again)", n)
		}
	})
	t.Run("admit", func(t *testing.T) {
		// At one slot a second with a burst of two, the replay answers the
		// slot the first run booked instead of booking the second: the
		// next admission takes it at once, and only the third waits.
		fl := startReplayFleet(t)
		now := time.Now()
		a := Admit{Now: now, Interval: time.Second, Tau: time.Second, MaxWait: 100 * time.Millisecond, TTL: time.Minute}
		dropped := fl.proxy.DropNext(admitScript.Hash(), fl.a.guardKey("up"))
		got, err := fl.a.Admit(fl.ctx, "up", a)
		waitFired(t, dropped)
		if err != nil || got.Verdict != "ok" || got.Wait != 0 {
			t.Fatalf("Admit = %+v, %v; want ok at once", got, err)
		}
		if got, err := fl.b.Admit(fl.ctx, "up", a); err != nil || got.Verdict != "ok" || got.Wait != 0 {
			t.Fatalf("second Admit = %+v, %v; want the burst's second slot at once", got, err)
		}
		if got, err := fl.b.Admit(fl.ctx, "up", a); err != nil || got.Verdict != "limited" || got.Wait != time.Second {
			t.Fatalf("third Admit = %+v, %v; want limited, a slot 1s away", got, err)
		}
	})
	t.Run("admit probe", func(t *testing.T) {
		// The replay of the admission that turned the breaker half-open
		// answers the probe slot the first run took, instead of finding
		// it taken (by itself).
		fl := startReplayFleet(t)
		now := time.Now()
		rec := Record{Now: now, Outcome: "f", FailureThreshold: 1, Window: 10 * time.Second, OpenFor: time.Second, CloseAfter: 1, Probes: 1, TTL: time.Minute}
		if _, to, err := fl.b.Record(fl.ctx, "up", rec); err != nil || to != "open" {
			t.Fatalf("Record = %q, %v; want the breaker open", to, err)
		}
		a := Admit{Now: now.Add(time.Second), Probes: 1, Lease: time.Minute, TTL: time.Minute}
		dropped := fl.proxy.DropNext(admitScript.Hash(), fl.a.guardKey("up"))
		got, err := fl.a.Admit(fl.ctx, "up", a)
		waitFired(t, dropped)
		if err != nil || got.Verdict != "ok" || got.Probe != 1 || got.Changed != "half" {
			t.Fatalf("Admit = %+v, %v; want the probe slot, the breaker turned half-open", got, err)
		}
		if got, err := fl.b.Admit(fl.ctx, "up", a); err != nil || got.Verdict != "open" {
			t.Fatalf("second Admit = %+v, %v; want open: the one probe slot is taken", got, err)
		}
	})
	t.Run("record", func(t *testing.T) {
		// The replay does not count the failure twice: with a threshold
		// of two, the breaker stays closed after one, and opens at the
		// second.
		fl := startReplayFleet(t)
		rec := Record{Outcome: "f", FailureThreshold: 2, Window: 10 * time.Second, OpenFor: time.Minute, CloseAfter: 1, Probes: 1, TTL: time.Minute}
		dropped := fl.proxy.DropNext(recordScript.Hash(), fl.a.guardKey("up"))
		from, to, err := fl.a.Record(fl.ctx, "up", rec)
		waitFired(t, dropped)
		if err != nil || from != "closed" || to != "" {
			t.Fatalf("Record = %q→%q, %v; want closed, unchanged", from, to, err)
		}
		if state, err := fl.b.BreakerState(fl.ctx, "up"); err != nil || state != "closed" {
			t.Fatalf("BreakerState = %q, %v; want closed after one failure", state, err)
		}
		if from, to, err := fl.b.Record(fl.ctx, "up", rec); err != nil || from != "closed" || to != "open" {
			t.Fatalf("second Record = %q→%q, %v; want it to open the breaker", from, to, err)
		}
	})
}
