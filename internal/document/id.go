package document

// Cache ids. A document is cached, locked and announced under its id:
// the canonical url when the caller gave no key (or the url itself), and
// otherwise the caller's key in a namespace of its own, scoped by the
// upstream ("key/<upstream>/<key>"). A url id starts with "http", so no key
// can take a url's place, and no upstream's caller can take another
// upstream's key. Every read also checks that the stored document is the
// caller's url: a key shared by two urls is a miss for the one that did not
// fill it, never the other url's body.
//
// A tenant's ids are in its namespace: "t/<tenant>/<id>", or the id itself
// for the default tenant (""), so that a coordd without tenants keeps its
// ids. No unscoped id starts with "t/" (they start with "http" or "key/"),
// and a tenant name has no "/", so that tenants never share a document.

// ID is the cache id of url (or of key, when set and not url) fetched from
// upstream, in tenant's namespace. An invalidation by key alone passes an
// empty url.
func ID(tenant, upstream, url, key string) string {
	id := url
	if key != "" && key != url {
		id = "key/" + upstream + "/" + key
	}
	if tenant == "" {
		return id
	}
	return "t/" + tenant + "/" + id
}

// ID is the cache id d is stored under, in its tenant's namespace.
func (d *Document) ID() string { return ID(d.Tenant, d.Upstream, d.URL, d.Key) }
