package store

// Layout names where a store with Prefix keeps things in Redis and how
// its scripts look on the wire. It exists for internal/testing/storetest alone,
// through which tests of other packages look at Redis (is a lock held, a
// document stored) or pick out one script's command (redistest.Proxy)
// without spelling key names; nothing else may depend on it.
type Layout struct{ Prefix string }

func (l Layout) store() *Redis { return &Redis{prefix: l.Prefix} }

// DocKey is the key of id's document in L2.
func (l Layout) DocKey(id string) string { return l.store().docKey(id) }

// LockKey is the key of id's fill lock; every key of id is in its slot.
func (l Layout) LockKey(id string) string { return l.store().lockKey(id) }

// GenKey is the key of id's generation.
func (l Layout) GenKey(id string) string { return l.store().genKey(id) }

// GuardKey is the key of upstream's shared guard.
func (l Layout) GuardKey(upstream string) string { return l.store().guardKey(upstream) }

// SlotKey is the set of upstream's slots in flight for a credential
// scope ("" for the fetches without one), in the guard's slot.
func (l Layout) SlotKey(upstream, scope string) string { return l.store().slotKey(upstream, scope) }

// Channel is the completion channel on a single Redis (or Sentinel).
func (l Layout) Channel() string { return l.store().channel() }

// ShardChannels are the shard channels on a Redis Cluster, in shard
// order: channel i's slot is in [1024i, 1024i+1024).
func (l Layout) ShardChannels() []string { return shardChannelNames(l.Prefix) }

// ScriptHash is the SHA1 of a script, as EVALSHA names it: "lock",
// "holder", "extend", "land", "handoff", "invalidate", "admit",
// "record", "lock+admit", "acquireslot" or "releaseslot"; "" for another
// name.
func ScriptHash(name string) string {
	s, ok := map[string]interface{ Hash() string }{
		"lock": lockScript, "holder": holderScript, "extend": extendScript, "land": landScript,
		"handoff": handOffScript, "invalidate": invalidateScript, "admit": admitScript, "record": recordScript,
		"lock+admit":  claimAdmitScript,
		"acquireslot": acquireSlotScript, "releaseslot": releaseSlotScript,
	}[name]
	if !ok {
		return ""
	}
	return s.Hash()
}

// EncodeEvent is ev as published on the completion channel.
func EncodeEvent(ev Event) []byte { return ev.encode() }

// DecodeEvent parses a message of the completion channel; ok is false
// for anything else.
func DecodeEvent(payload string) (ev Event, ok bool) { return decodeEvent(payload) }
