package coordinator

import "github.com/coordd/coordd/coordinator/document"

// A document is cached, locked and announced under its cache id (see
// document.ID), in its tenant's namespace.

// flightKey identifies t's flight in this instance: one per id and url, so
// that callers of one key with different urls never share a fetch.
func (t Target) flightKey() string { return t.id + "\n" + t.URL }

// serves reports whether d answers for t: the same id and the same url.
func (t Target) serves(d *document.Document) bool {
	return d != nil && d.URL == t.URL && d.ID() == t.id
}
