package store

// SetTrace makes the done and fail events that l publishes (Land,
// HandOff) carry traceparent, the W3C traceparent of the fetch made under
// l, so that followers on other instances can link their spans to it. It
// travels in the event rather than in the lock's value, which the scripts
// compare with tokens. Call it before Land or HandOff, from the goroutine
// that holds l.
func (l *Lease) SetTrace(traceparent string) { l.trace = traceparent }
