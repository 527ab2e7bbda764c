package upstream

import (
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// FuzzInFlightGoVsLua is the differential test of the cap on requests in
// flight (Protection.MaxInFlight): localSlots in Go against the store's
// acquireSlotScript and releaseSlotScript in Lua (through a real
// redis-server, on one clock). Each input is a cap, a lease and a sequence
// of operations — try to take a slot of one of three credential scopes,
// give a held one back (or one twice), advance the clock past or short of
// leases — and every answer must agree: whether a slot was taken, how long
// until the earliest lease ends when none was, and the live slots of each
// scope. Times are whole microseconds, the scripts' resolution.
//
// go test runs the seeds in testdata/fuzz/FuzzInFlightGoVsLua; to search:
//
//	go test -fuzz FuzzInFlightGoVsLua -fuzztime 60s ./internal/upstream
func FuzzInFlightGoVsLua(f *testing.F) {
	st := testStore(f) // skips under -short: it needs redis-server
	var keys atomic.Int64
	f.Fuzz(func(t *testing.T, policy, ops []byte) {
		var b [2]byte
		copy(b[:], policy)
		maxN := 1 + int(b[0]%5)
		lease := time.Duration(1+b[1]%40) * 50 * time.Millisecond
		clk := newTestClock()
		local := &localSlots{max: maxN, lease: lease, now: clk.Now, scopes: make(map[string]*localScope)}
		name := fmt.Sprintf("fuzzf%d", keys.Add(1))
		type held struct {
			scope string
			l     heldSlot
			token string
		}
		var slots []held
		var trace []string
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("max %d, lease %v, after\n\t%s\n"+format, append([]any{maxN, lease, strings.Join(trace, "\n\t")}, args...)...)
		}
		scopes := [...]string{"", "s/a", "s/b"}
		for len(ops) >= 2 {
			op, arg := ops[0], ops[1]
			ops = ops[2:]
			switch op % 3 {
			case 0: // try to take a slot
				scope := scopes[int(arg)%len(scopes)]
				l, lwait, err := local.acquire(t.Context(), nil, scope, 0, nil)
				if err != nil {
					t.Fatal(err)
				}
				s, err := st.AcquireSlot(t.Context(), name, scope, SharedAcquire{Now: clk.Now, Max: maxN, Lease: lease})
				if err != nil {
					t.Fatalf("shared acquire: %v", err)
				}
				lok, sok := l.local != nil, s.Token != ""
				trace = append(trace, fmt.Sprintf("acquire(%q) = %v (wait %v)", scope, lok, lwait))
				if lok != sok || (!lok && lwait != s.Wait) {
					fail("acquire(%q): Go taken %v, wait %v; Lua taken %v, wait %v, held %d", scope, lok, lwait, sok, s.Wait, s.Held)
				}
				if lok {
					slots = append(slots, held{scope, l, s.Token})
				}
			case 1: // give one back; with the high bit, keep it to give back again
				if len(slots) == 0 {
					continue
				}
				i := int(arg) % len(slots)
				h := slots[i]
				if op&0x80 == 0 {
					slots = append(slots[:i], slots[i+1:]...)
				}
				trace = append(trace, fmt.Sprintf("release(%q)", h.scope))
				local.release(h.scope, h.l.local, h.l.id)
				if err := st.ReleaseSlot(t.Context(), name, h.scope, SharedRelease{Now: clk.Now(), Token: h.token, Max: maxN}); err != nil {
					t.Fatalf("shared release: %v", err)
				}
			case 2: // time passes: by steps around the lease
				d := lease / 4 * time.Duration(1+arg%8)
				if arg&0x80 != 0 {
					d -= time.Microsecond
				}
				clk.Advance(d)
				trace = append(trace, fmt.Sprintf("advance %v", d))
			}
			s, err := st.SlotsInFlight(t.Context(), name, clk.Now())
			if err != nil {
				t.Fatalf("shared in flight: %v", err)
			}
			l := local.held()
			if !maps.Equal(map[string]int(s), l) {
				fail("in flight: Go %v; Lua %v", l, s)
			}
		}
	})
}
