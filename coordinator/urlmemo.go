package coordinator

import (
	"fmt"
	"hash/maphash"
	"sync/atomic"

	"github.com/coordd/coordd/internal/upstream"
)

// urlMemo remembers, for urls resolved lately, the canonical url and the
// upstream it belongs to. Warm hits name the same urls over and over, and
// canonicalising one (net/url's parse, the path and query checks, String)
// was the largest part of coordd's own work on a warm hit
// (docs/performance.md). Both are functions of the url and of the
// Coordinator's upstreams, which never change, so a remembered answer is
// never stale.
//
// Hand-rolled, as a direct-mapped table of atomic pointers: a lookup is
// one hash, one atomic load and one string comparison, with no lock and
// no eviction bookkeeping; a url whose slot is taken replaces what it
// holds. Only urls that belong to an upstream and are at most
// urlMemoMaxURL bytes long are kept, so the table holds at most
// urlMemoSlots × 2 × urlMemoMaxURL bytes of text.
type urlMemo struct {
	seed  maphash.Seed
	slots [urlMemoSlots]atomic.Pointer[canonicalURL]
}

const (
	urlMemoSlots  = 1024
	urlMemoMaxURL = 512
)

// canonicalURL is a url as a caller wrote it, resolved.
type canonicalURL struct {
	raw string    // as written
	url string    // upstream.CanonicalURL's, as a string
	up  *Upstream // the upstream it belongs to
}

func newURLMemo() *urlMemo { return &urlMemo{seed: maphash.MakeSeed()} }

// canonical returns raw's canonical url and the upstream it belongs to,
// nil if none: what upstream.CanonicalURL and match find, remembered.
// Errors are CanonicalURL's.
func (c *Coordinator) canonical(raw string) (string, *Upstream, error) {
	slot := &c.urls.slots[maphash.String(c.urls.seed, raw)%urlMemoSlots]
	if e := slot.Load(); e != nil && e.raw == raw {
		return e.url, e.up, nil
	}
	u, err := upstream.CanonicalURL(raw)
	if err != nil {
		return "", nil, err
	}
	e := &canonicalURL{raw: raw, url: u.String(), up: c.match(u)}
	if e.up != nil && len(raw) <= urlMemoMaxURL {
		slot.Store(e)
	}
	return e.url, e.up, nil
}

// outside is the error for a url that belongs to no upstream. A canonical
// url has no userinfo (CanonicalURL refuses it), so it is its own
// redacted form.
func outside(url string) error {
	return ofKind(fmt.Errorf("%w: url %s is outside every configured upstream", ErrForbidden, url), ErrOutsideUpstreams)
}
