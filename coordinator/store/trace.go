package store

// SetTrace makes the done and fail events that l publishes (Land,
// HandOff) carry traceparent, the W3C traceparent of the fetch made under
// l, so that followers on other instances can link their spans to it. It
// travels in the event rather than in the lock's value, which the scripts
// compare with tokens. Call it before Land or HandOff, from the goroutine
// that holds l; a nil Lease ignores it.
func (l *Lease) SetTrace(traceparent string) {
	if l != nil {
		l.trace = traceparent
	}
}

// traceparent is what SetTrace set; "" for a nil Lease.
func (l *Lease) traceparent() string {
	if l == nil {
		return ""
	}
	return l.trace
}
