// Package document is what coordd caches: a Document (one upstream
// answer), its binary encoding for L1 and L2, the checks on the header
// values it keeps, its cache id, and its lifetime as the upstream's
// Cache-Control sets it (RFC 9111, with RFC 5861's stale-while-revalidate
// and stale-if-error). It depends on the standard library only.
package document
