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
// A document fetched with a credential, or with forwarded request headers,
// is in its scope's namespace: "<scope>/<id>", where scope is
// "s/<credential scope id>", "v/<variant>" or "s/<…>/v/<…>" (built by the
// coordinator; neither holds anything a secret can be read from). Callers
// with different credentials or variants never share a document.
//
// A custom key is in its tenant's namespace too: "t/<tenant>/<id>", or the
// id itself for the default tenant (""), so that a coordd without tenants
// keeps its ids, and no tenant can fill or invalidate another's key. A url
// id is not: what it holds is the upstream's answer to the url, with the
// scope's credential and variant, which no tenant chooses, so tenants
// share it. No id starts with "t/", "s/" or "v/" otherwise (they start
// with "http" or "key/"), and a tenant name has no "/".

// ID is the cache id of url (or of key, when set and not url) fetched from
// upstream in scope, a custom key in tenant's namespace. An invalidation
// by key alone passes an empty url.
func ID(tenant, scope, upstream, url, key string) string {
	id := url
	custom := key != "" && key != url
	if custom {
		id = "key/" + upstream + "/" + key
	}
	if scope != "" {
		id = scope + "/" + id
	}
	if custom && tenant != "" {
		id = "t/" + tenant + "/" + id
	}
	return id
}

// ID is the cache id d is stored under.
func (d *Document) ID() string { return ID(d.Tenant, d.Scope, d.Upstream, d.URL, d.Key) }
