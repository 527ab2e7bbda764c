package store

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/internal/guardwire"
)

// Mode names the kind of Redis deployment r talks to: "cluster" (Redis
// Cluster), "sentinel" (a master found through Redis Sentinel, as
// Config.Sentinel says) or "redis" (one server, or a proxy in front of
// some).
func (r *Redis) Mode() string {
	if _, ok := r.rdb.(*redis.ClusterClient); ok {
		return "cluster"
	}
	if r.sentinel {
		return "sentinel"
	}
	return "redis"
}

// guardStateScript reads upstream's shared guard without changing it:
// {state, until µs, tat µs, backoff µs, now µs}, now being Redis's clock
// (or ARGV[1]) so that the caller can tell how far off each time is.
var guardStateScript = redis.NewScript(luaNow + `
local v = redis.call('HMGET', KEYS[1], 'state', 'until', 'tat', 'backoff')
return {v[1] or 'closed', v[2] or '0', v[3] or '0', v[4] or '0', fmt(now)}`)

// GuardState is the shared guard of one upstream as a status page shows
// it (guardwire.GuardState).
type GuardState = guardwire.GuardState

// GuardState reads upstream's shared guard in one round trip, read-only,
// within ctx and the Redis timeout. now is the guard's clock (zero:
// Redis's). It fails fast while Redis is down.
func (r *Redis) GuardState(ctx context.Context, upstream string, now time.Time) (GuardState, error) {
	var res []any
	err := r.ifUp(ctx, func(ctx context.Context) (err error) {
		res, err = guardStateScript.Run(ctx, r.rdb, []string{r.guardKey(upstream)}, clock(now)).Slice()
		return err
	})
	if err != nil {
		return GuardState{}, err
	}
	if len(res) != 5 {
		return GuardState{}, fmt.Errorf("%w: guard state script answered %v", ErrUnavailable, res)
	}
	var us [4]int64 // until, tat, backoff, now
	for i := range us {
		s, _ := res[i+1].(string)
		if _, err := fmt.Sscan(s, &us[i]); err != nil {
			return GuardState{}, fmt.Errorf("%w: guard state script answered %v", ErrUnavailable, res)
		}
	}
	state, _ := res[0].(string)
	at := func(t int64) time.Duration { return time.Duration(t-us[3]) * time.Microsecond }
	g := GuardState{Breaker: state, TAT: at(us[1]), Backoff: max(at(us[2]), 0)}
	if state == "open" {
		g.Until = max(at(us[0]), 0)
	}
	g.Quotas, err = r.quotas(ctx, upstream, us[3])
	return g, err
}

// maxStatusQuotas bounds the learned quotas a status read returns.
const maxStatusQuotas = 100

// quotas reads upstream's learned quotas (at most maxStatusQuotas), in
// two round trips, their times measured from nowUS (µs).
func (r *Redis) quotas(ctx context.Context, upstream string, nowUS int64) ([]guardwire.QuotaState, error) {
	var out []guardwire.QuotaState
	err := r.ifUp(ctx, func(ctx context.Context) error {
		scopes, err := r.rdb.SRandMemberN(ctx, r.quotaIndex(upstream), maxStatusQuotas).Result()
		if err != nil || len(scopes) == 0 {
			return err
		}
		slices.Sort(scopes)
		cmds := make([]*redis.MapStringStringCmd, len(scopes))
		_, err = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, sc := range scopes {
				cmds[i] = p.HGetAll(ctx, r.quotaKey(upstream, sc))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for i, c := range cmds {
			h := c.Val()
			num := func(f string) int64 { n, _ := strconv.ParseInt(h[f], 10, 64); return n }
			var parts []string
			for f := range h {
				if p, ok := strings.CutPrefix(f, "seen|"); ok {
					parts = append(parts, p)
				}
			}
			slices.Sort(parts)
			for _, p := range parts {
				q := guardwire.QuotaState{Key: scopes[i] + "|" + p, Label: h["label|"+p], Partition: p, Source: h["src|"+p],
					Limit: num("limit|" + p), Remaining: num("rem|" + p), Age: time.Duration(nowUS-num("seen|"+p)) * time.Microsecond}
				if h["rem|"+p] != "" && num("reset|"+p) > nowUS {
					q.Reset = time.Duration(num("reset|"+p)-nowUS) * time.Microsecond
				}
				if out = append(out, q); len(out) == maxStatusQuotas {
					return nil
				}
			}
		}
		return nil
	})
	return out, err
}
