package upstream

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Quota is what an upstream's answer says of the quota it counts the
// request against: RateLimit and RateLimit-Policy
// (draft-ietf-httpapi-ratelimit-headers), or X-RateLimit-Limit,
// -Remaining and -Reset (GitHub, and many others; GitHub names the
// partition in X-RateLimit-Resource).
type Quota struct {
	Limit     int64         // requests per window; 0: not said
	Remaining int64         // requests left in the window
	Reset     time.Duration // until the window resets (from the answer's arrival)
	Partition string        // the quota's partition (GitHub's resource, the draft's policy name); "" the default
	Source    string        // the header it was read from
}

// maxQuotaReset bounds a reset that is believed: one further away is
// garbage (a clock in milliseconds, a year typed wrong), never a reason to
// stop calling the upstream for that long.
const maxQuotaReset = 24 * time.Hour

// epochFloor tells an epoch reset from a delta in seconds: a value past
// it is a Unix time (2001-09-09), as no window lasts 31 years.
const epochFloor = 1_000_000_000

// parseQuota reads the quota h announces, received at now. ok is false
// when h announces none, or only garbage: negative or non-numeric values,
// a remaining over the limit, a reset in the past or past maxQuotaReset.
// The draft's fields win over X-RateLimit-*; within X-RateLimit-Reset an
// epoch time and a delta in seconds are told apart by epochFloor.
func parseQuota(h http.Header, now time.Time) (q Quota, ok bool) {
	if v := h.Get("RateLimit"); v != "" {
		if q, ok = parseDraftQuota(v, h.Get("RateLimit-Policy")); ok {
			return q, true
		}
	}
	rem, okRem := nonNegative(h.Get("X-RateLimit-Remaining"))
	if !okRem {
		return Quota{}, false
	}
	q = Quota{Remaining: rem, Partition: strings.TrimSpace(h.Get("X-RateLimit-Resource")), Source: "X-RateLimit-Remaining"}
	if limit, ok := nonNegative(h.Get("X-RateLimit-Limit")); ok {
		if rem > limit {
			return Quota{}, false // the two disagree: believe neither
		}
		q.Limit = limit
	}
	reset, ok := nonNegative(h.Get("X-RateLimit-Reset"))
	if !ok {
		return Quota{}, false
	}
	if reset >= epochFloor {
		q.Reset = time.Unix(reset, 0).Sub(now)
	} else {
		q.Reset = time.Duration(reset) * time.Second
	}
	if q.Reset < 0 || q.Reset > maxQuotaReset {
		return Quota{}, false
	}
	return q, true
}

// parseDraftQuota reads the draft's RateLimit field ("default";r=50;t=30),
// and the quota from RateLimit-Policy ("default";q=100;w=60) for the same
// policy name.
func parseDraftQuota(rl, policy string) (Quota, bool) {
	name, params := sfItem(rl)
	r, okR := nonNegative(params["r"])
	t, okT := nonNegative(params["t"])
	if !okR || !okT || time.Duration(t)*time.Second > maxQuotaReset {
		return Quota{}, false
	}
	q := Quota{Remaining: r, Reset: time.Duration(t) * time.Second, Partition: name, Source: "RateLimit"}
	if name == "default" {
		q.Partition = ""
	}
	if pk := params["pk"]; pk != "" {
		q.Partition = strings.Trim(pk, ":")
	}
	for item := range strings.SplitSeq(policy, ",") {
		if pname, pp := sfItem(item); pname == name {
			if limit, ok := nonNegative(pp["q"]); ok && limit >= r {
				q.Limit = limit
			}
		}
	}
	return q, true
}

// sfItem reads a structured-field item with parameters (RFC 8941), as
// far as the draft's fields need: a name (a string or token) and
// key=value parameters.
func sfItem(v string) (string, map[string]string) {
	parts := strings.Split(strings.TrimSpace(v), ";")
	name := strings.Trim(strings.TrimSpace(parts[0]), `"`)
	params := map[string]string{}
	for _, p := range parts[1:] {
		k, val, _ := strings.Cut(strings.TrimSpace(p), "=")
		params[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(val)
	}
	return name, params
}

// nonNegative parses a non-negative integer of at most 15 digits.
func nonNegative(v string) (int64, bool) {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 15 || strings.Trim(v, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

// RateLimited reports whether resp is the upstream refusing a request for
// its quota rather than its content: a 429, or a 403 that says so
// (X-RateLimit-Remaining: 0, RateLimit with r=0, or a Retry-After), as
// GitHub answers both its primary and its secondary limits. Such an answer
// is a backoff for every instance, not a breaker failure, and not a
// document to deliver.
func RateLimited(resp *Response, now time.Time) bool {
	if resp == nil {
		return false
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		return true
	case http.StatusForbidden:
		if resp.Header.Get("Retry-After") != "" {
			return true
		}
		q, ok := parseQuota(resp.Header, now)
		return ok && q.Remaining == 0
	}
	return false
}
