package store

import (
	"context"
	"time"

	"github.com/coordd/coordd/internal/document"
)

// Land stores a fetched document of id, encoded as enc, in L2 for ttl (or,
// if uncacheable or ttl is under a millisecond, in a short-lived result
// key for followers, dropping the old copy), releases l and wakes the
// followers of every instance: one script, fenced against Invalidate by
// l's token or by gen, the generation read before the fetch (see
// landScript). It runs whatever the health state says, bounded by the
// timeout, so that a leader that degraded or lost a reply still wakes
// those who wait on its lock; a document written to L2 is always
// announced. landed is false when the script refused (the fill was
// fenced); the caller then hands off with a release, as on an error.
//
// l is nil when the fill holds no lock (Redis was down when it asked):
// the landing is then fenced by gen alone.
func (r *Redis) Land(l *Lease, id, gen string, enc []byte, ttl time.Duration, cacheable bool) (landed bool, err error) {
	var token, trace string
	if l != nil {
		l.StopWatchdog()
		token, trace = l.token, l.trace
	}
	rkey := r.docKey(id)
	if !cacheable || ttl < time.Millisecond {
		rkey, ttl = r.prefix+"{"+id+"}:result:"+newToken(), r.resultTTL
	}
	ev := Event{Type: EventDone, Key: id, Token: token, Result: rkey, Drop: !cacheable, Trace: trace}
	if len(enc) <= r.inlineMax {
		ev.Doc = enc
	}
	payload := ev.encode()
	channel, msg := r.scriptPublish(payload)
	var n int64
	ctx, cancel := context.WithCancel(context.Background()) // even while closing
	defer cancel()
	err = r.evenIfDown(ctx, len(enc)+len(msg), func(ctx context.Context) (err error) {
		n, err = r.runOnce(ctx, landScript, r.docKey(id),
			[]string{rkey, r.lockKey(id), r.genKey(id), r.docKey(id)},
			token, gen, enc, ttl.Milliseconds(), channel, msg).Int64()
		if err == nil && n == 1 {
			err = r.announce(ctx, id, payload)
		}
		return err
	})
	return err == nil && n == 1, err
}

// HandOff releases l, then publishes ev (its Key and Token set from l) to
// every instance's followers, in one script, whatever the health state
// says (bounded by the timeout). The order matters: a follower woken by ev
// must find the lock free, or it would wait for a lease that nobody holds
// any more. A done event without a Result names id's document in L2.
func (l *Lease) HandOff(ev Event) {
	l.StopWatchdog()
	r := l.r
	ev.Key, ev.Token = l.id, l.token
	if ev.Trace == "" && (ev.Type == EventDone || ev.Type == EventFail) {
		ev.Trace = l.trace
	}
	if ev.Type == EventDone && ev.Result == "" {
		ev.Result = r.docKey(l.id)
	}
	ctx, cancel := context.WithCancel(context.Background()) // even while closing
	defer cancel()
	payload := ev.encode()
	channel, msg := r.scriptPublish(payload)
	_ = r.evenIfDown(ctx, 0, func(ctx context.Context) error {
		if err := r.runOnce(ctx, handOffScript, l.lockKey(), []string{l.lockKey()}, l.token, channel, msg).Err(); err != nil {
			return err
		}
		return r.announce(ctx, ev.Key, payload)
	})
}

// Invalidate deletes id's document and lock from L2, bumps its generation
// (kept for genTTL), which fences every fill of it in flight, and
// publishes an inval event. It reports whether L2 held the document. It
// fails fast while Redis is down.
func (r *Redis) Invalidate(ctx context.Context, id string, genTTL time.Duration) (existed bool, err error) {
	var n int64
	payload := Event{Type: EventInval, Key: id}.encode()
	channel, msg := r.scriptPublish(payload)
	err = r.ifUp(ctx, func(ctx context.Context) (err error) {
		n, err = r.runOnce(ctx, invalidateScript, r.docKey(id), []string{r.docKey(id), r.lockKey(id), r.genKey(id)},
			channel, msg, genTTL.Milliseconds()).Int64()
		if err == nil {
			err = r.announce(ctx, id, payload)
		}
		return err
	})
	if err != nil {
		return false, err
	}
	return n > 0, nil
}

// Landed returns the document a done event announces, from the event
// itself when it came inline, else from Redis; nil unless it is of the
// event's id. cached reports whether it landed in L2 as the id's document,
// rather than in a result key (an uncacheable answer, to be used as it
// is).
func (r *Redis) Landed(ctx context.Context, ev Event) (d *document.Document, enc []byte, cached bool) {
	enc = ev.Doc // small documents come inline: no L2 read
	if len(enc) > 0 {
		if d, _ = document.Decode(enc); d != nil && d.ID() != ev.Key {
			d = nil
		}
	}
	if d == nil {
		d, enc = r.getRaw(ctx, ev.Result, ev.Key)
	}
	return d, enc, ev.Result == r.docKey(ev.Key)
}
