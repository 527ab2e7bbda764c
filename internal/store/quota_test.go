package store

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/guardwire"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// recordQuota records one answer of upstream announcing the quota
// (remaining, limit, reset), as the record script receives it whoever
// sent it, and returns the quotas the shared guard then holds.
func recordQuota(t testing.TB, r *Redis, upstream string, remaining, limit int64, reset time.Duration) []guardwire.QuotaState {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	rec := Record{Now: now, Outcome: "s", FailureThreshold: 5, Window: 10 * time.Second, OpenFor: time.Second, CloseAfter: 1, Probes: 1, TTL: time.Minute,
		Quota: &guardwire.QuotaNote{Scope: "s", Route: "repos", Remaining: remaining, Limit: limit, Reset: reset, Source: "X-RateLimit-Remaining", Label: "no credential"}}
	if _, _, err := r.Record(ctx, upstream, rec); err != nil {
		t.Fatal(err)
	}
	g, err := r.GuardState(ctx, upstream, now)
	if err != nil {
		t.Fatal(err)
	}
	return g.Quotas
}

// TestGarbageQuotaNotRecorded: the shared store's script learns nothing
// from the numbers a naive reading takes from the garbage corpus
// (testdata/quota-garbage), whatever instance sends them; it learns a
// consistent quota as it was announced.
func TestGarbageQuotaNotRecorded(t *testing.T) {
	r, _ := startStore(t, redistest.Start(t).Client(t))
	b, err := os.ReadFile("../../testdata/quota-garbage/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var corpus struct {
		Cases []struct {
			Name    string
			Numbers *struct{ Remaining, Limit, Reset int64 }
		}
	}
	if err := json.Unmarshal(b, &corpus); err != nil {
		t.Fatal(err)
	}
	n := 0
	for i, c := range corpus.Cases {
		if c.Numbers == nil {
			continue
		}
		n++
		if got := recordQuota(t, r, fmt.Sprint("garbage", i), c.Numbers.Remaining, c.Numbers.Limit, time.Duration(c.Numbers.Reset)*time.Second); len(got) != 0 {
			t.Errorf("%s: the store learned %+v; want nothing", c.Name, got)
		}
	}
	if n < 10 {
		t.Fatalf("%d cases with numbers in the corpus; want at least 10", n)
	}
	got := recordQuota(t, r, "sane", 0, 5000, 24*time.Hour)
	if len(got) != 1 || got[0].Limit != 5000 || got[0].Remaining != 0 || got[0].Reset < 23*time.Hour {
		t.Errorf("a quota spent for a day: learned %+v; want limit 5000, remaining 0, reset in a day", got)
	}
}

// FuzzRecordQuota: the record script learns a quota if and only if it is
// one consistent (limit, remaining, reset), the Go parser's bounds, and
// what it learns is within them.
func FuzzRecordQuota(f *testing.F) {
	r, _ := startStore(f, redistest.Start(f).Client(f))
	f.Add(int64(1), int64(0), int64(86000))
	f.Add(int64(1000), int64(10), int64(30))
	f.Add(int64(0), int64(100), int64(86401))
	f.Add(int64(0), int64(100), int64(-1))
	f.Add(int64(-1), int64(100), int64(30))
	f.Add(int64(4999), int64(5000), int64(3600))
	f.Add(int64(0), int64(1), int64(0))
	n := 0
	f.Fuzz(func(t *testing.T, remaining, limit, resetSec int64) {
		resetSec = max(min(resetSec, 1<<40), -(1 << 40))
		reset := time.Duration(resetSec) * time.Second
		n++
		got := recordQuota(t, r, fmt.Sprint("fuzz", n), remaining, limit, reset)
		valid := limit >= 1 && remaining >= 0 && remaining <= limit && reset >= 0 && reset <= guardwire.MaxQuotaReset
		if valid != (len(got) == 1) {
			t.Fatalf("(%d, %d, %v): learned %+v; want learned %v", remaining, limit, reset, got, valid)
		}
		for _, q := range got {
			if q.Limit != limit || q.Remaining > q.Limit || q.Reset > guardwire.MaxQuotaReset {
				t.Fatalf("(%d, %d, %v): learned %+v", remaining, limit, reset, q)
			}
		}
	})
}
