package coordinator

// Cache ids. A document is cached, locked and announced under its id:
// the canonical url when the caller gave no key (or the url itself), and
// otherwise the caller's key in a namespace of its own, scoped by the
// upstream ("key/<upstream>/<key>"). A url id starts with "http", so no key
// can take a url's place, and no upstream's caller can take another
// upstream's key. Every read also checks that the stored document is the
// caller's url: a key shared by two urls is a miss for the one that did not
// fill it, never the other url's body. A tenant's ids are prefixed with
// its name (see scopedID), so that tenants never share a document.

func cacheID(upstream, url, key string) string {
	if key == "" || key == url {
		return url
	}
	return "key/" + upstream + "/" + key
}

// id is the cache id d is stored under, in its tenant's namespace (see
// scopedID).
func (d *Document) id() string { return scopedID(d.Tenant, cacheID(d.Upstream, d.URL, d.Key)) }

// flightKey identifies t's flight in this instance: one per id and url, so
// that callers of one key with different urls never share a fetch.
func (t Target) flightKey() string { return t.id + "\n" + t.URL }

// serves reports whether d answers for t: the same id and the same url.
func (t Target) serves(d *Document) bool { return d != nil && d.URL == t.URL && d.id() == t.id }
