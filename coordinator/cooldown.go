package coordinator

import (
	"sync"
	"time"
)

// maxCooling bounds the ids kept cooling down: past it, the oldest
// cooldown ends early.
const maxCooling = 4096

// cooldowns holds the ids whose refresh failed lately, each until its
// cooldown ends, at most maxCooling of them. It is safe for concurrent use.
//
// Hand-rolled rather than hashicorp/golang-lru's expirable LRU, which
// reads time.Now instead of Config.Now and starts a reaper goroutine that
// nothing stops. Every cooldown lasts as long, so the order of insertion
// is the order of expiry: an insert drops the expired, and past the
// bound the oldest, from the front of a FIFO queue, in amortized constant
// time, never visiting the others.
type cooldowns struct {
	mu    sync.Mutex           // protects until and queue
	until map[string]time.Time // id → end of its cooldown
	queue []cooling            // oldest first; an entry id re-cooled since is stale
}

// cooling is an id's cooldown, as queued.
type cooling struct {
	id    string
	until time.Time
}

// start cools id down until until.
func (c *cooldowns) start(id string, now, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.until == nil {
		c.until = make(map[string]time.Time)
	}
	for len(c.queue) > 0 && (len(c.queue) >= maxCooling || !now.Before(c.queue[0].until)) {
		e := c.queue[0]
		c.queue[0] = cooling{}
		c.queue = c.queue[1:]
		if u, ok := c.until[e.id]; ok && u.Equal(e.until) {
			delete(c.until, e.id) // not re-cooled since
		}
	}
	c.until[id] = until
	c.queue = append(c.queue, cooling{id, until})
}

// active reports whether id is cooling down at now.
func (c *cooldowns) active(id string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	until, ok := c.until[id]
	return ok && now.Before(until)
}

// len is how many ids are kept, expired or not.
func (c *cooldowns) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.until)
}

// coolDown stops stale hits from starting background refreshes of id for
// Config.RefreshCooldown after a refresh failed: the stale copy is served
// meanwhile, and the upstream is not asked again on every hit.
func (c *Coordinator) coolDown(id string) {
	if c.cfg.RefreshCooldown <= 0 {
		return
	}
	now := c.cfg.Now()
	c.cooling.start(id, now, now.Add(c.cfg.RefreshCooldown))
}

// coolingDown reports whether id's refresh is cooling down at now.
func (c *Coordinator) coolingDown(id string, now time.Time) bool {
	return c.cooling.active(id, now)
}
