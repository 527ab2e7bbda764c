package server

import (
	"runtime"
	"sync"
	"weak"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// frameCache holds the chunk frames of the Documents alive in this
// process, so that a body is framed once per Document rather than once
// per caller, however many streams and Servers send it. It is keyed by
// weak pointers, as L1's map of live Documents is (internal/l1): an
// entry does not keep its Document alive (its frames slice the body, not
// the Document), and a cleanup drops it once the Document is collected.
// The zero value is ready; it is safe for concurrent use.
type frameCache struct {
	m sync.Map // weak.Pointer[coordinator.Document] → *frameEntry
}

type frameEntry struct {
	once sync.Once // the first caller builds fs and hdrs; the others wait for it
	fs   []*frame
	hdrs []*coorddv1.Header // d's response headers, shared read-only by every metadata message
	meta metaWire           // d's metadata fields that no call changes, in wire form
}

// get returns d's frames, built on the first call for d.
func (c *frameCache) get(d *coordinator.Document) []*frame { return c.entry(d).fs }

// entry returns d's entry, built on the first call for d.
func (c *frameCache) entry(d *coordinator.Document) *frameEntry {
	k := weak.Make(d)
	v, ok := c.m.Load(k)
	if !ok {
		var loaded bool
		if v, loaded = c.m.LoadOrStore(k, &frameEntry{}); !loaded {
			runtime.AddCleanup(d, c.drop, k)
		}
	}
	e := v.(*frameEntry)
	e.once.Do(func() {
		e.fs, e.hdrs = buildFrames(d), headersPB(d.Header)
		e.meta = buildMetaWire(d, e.hdrs)
	})
	return e
}

// drop forgets the frames of a Document that has been collected.
func (c *frameCache) drop(k weak.Pointer[coordinator.Document]) { c.m.Delete(k) }

// len returns how many Documents have frames held, for tests.
func (c *frameCache) len() int {
	n := 0
	c.m.Range(func(any, any) bool { n++; return true })
	return n
}

// framed holds the frames of every Document this process sends: one cache
// for every Server, as the Documents are shared by all of them.
var framed frameCache

// frames returns d's chunk frames, built on the first call for d and
// shared by every later caller.
func frames(d *coordinator.Document) []*frame { return framed.get(d) }

// metaHeaders returns d's response headers for its metadata messages,
// built once per Document: protobuf messages may be marshalled
// concurrently as long as nobody modifies them.
func metaHeaders(d *coordinator.Document) []*coorddv1.Header { return framed.entry(d).hdrs }
