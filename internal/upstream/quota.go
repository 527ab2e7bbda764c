package upstream

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coordd/coordd/internal/guardwire"
)

// Quota is what an upstream's answer says of the quota it counts the
// request against: RateLimit and RateLimit-Policy
// (draft-ietf-httpapi-ratelimit-headers), or X-RateLimit-Limit,
// -Remaining and -Reset (GitHub, and many others; GitHub names the
// partition in X-RateLimit-Resource).
type Quota struct {
	Limit     int64         // requests per window, at least 1
	Remaining int64         // requests left in the window
	Reset     time.Duration // until the window resets (from the answer's arrival)
	Partition string        // the quota's partition (GitHub's resource, the draft's policy name); "" the default
	Source    string        // the header it was read from
}

// maxQuotaReset bounds a reset that is believed (guardwire.MaxQuotaReset).
const maxQuotaReset = guardwire.MaxQuotaReset

// epochFloor tells an epoch reset from a delta in seconds: a value past
// it is a Unix time (2001-09-09), as no window lasts 31 years.
const epochFloor = 1_000_000_000

// parseQuota reads the quota h announces, received at now. ok is false
// when h announces none, or only garbage (see readQuota).
func parseQuota(h http.Header, now time.Time) (q Quota, ok bool) {
	q, ok, _ = readQuota(h, now)
	return q, ok
}

// readQuota reads the quota h announces, received at now, through one
// validation for both header families: what is learned is one consistent
// (limit, remaining, reset) or nothing. When h carries the draft's
// RateLimit field it alone is read (with the RateLimit-Policy item of the
// same name for its limit); else X-RateLimit-Limit, -Remaining and -Reset,
// where an epoch time and a delta in seconds are told apart by
// epochFloor. An answer is garbage, and ignored whole, when a value is
// negative, non-numeric or over 15 digits, the limit is missing or 0, the
// remaining is over the limit, the reset is in the past or past
// maxQuotaReset, or the draft's window is 0, past maxQuotaReset or shorter
// than the reset. garbage then says which header and why, in numbers only
// (it is logged); it is "" when h announces a quota or none.
func readQuota(h http.Header, now time.Time) (q Quota, ok bool, garbage string) {
	if rl := h.Get("RateLimit"); rl != "" {
		q, why := parseDraftQuota(rl, h.Values("RateLimit-Policy"))
		if why != "" {
			return Quota{}, false, "RateLimit: " + why
		}
		return q, true, ""
	}
	remv := h.Get("X-RateLimit-Remaining")
	if remv == "" {
		return Quota{}, false, ""
	}
	bad := func(why string) (Quota, bool, string) { return Quota{}, false, "X-RateLimit: " + why }
	rem, okRem := nonNegative(remv)
	limit, okLimit := nonNegative(h.Get("X-RateLimit-Limit"))
	reset, okReset := nonNegative(h.Get("X-RateLimit-Reset"))
	switch {
	case !okRem:
		return bad("remaining is not a number of at most 15 digits")
	case !okLimit:
		return bad("no limit, or not a number of at most 15 digits")
	case !okReset:
		return bad("no reset, or not a number of at most 15 digits")
	}
	q = Quota{Limit: limit, Remaining: rem, Partition: strings.TrimSpace(h.Get("X-RateLimit-Resource")), Source: "X-RateLimit-Remaining"}
	if reset >= epochFloor {
		q.Reset = time.Unix(reset, 0).Sub(now)
	} else {
		q.Reset = time.Duration(reset) * time.Second
	}
	if why := q.inconsistent(); why != "" {
		return bad(why)
	}
	return q, true, ""
}

// inconsistent says why q cannot be believed, or "" when it can.
func (q Quota) inconsistent() string {
	switch {
	case q.Limit < 1:
		return fmt.Sprintf("limit %d (a quota allows at least one request)", q.Limit)
	case q.Remaining > q.Limit:
		return fmt.Sprintf("remaining %d over the limit %d", q.Remaining, q.Limit)
	case q.Reset < 0:
		return fmt.Sprintf("reset %v in the past", -q.Reset.Round(time.Second))
	case q.Reset > maxQuotaReset:
		return fmt.Sprintf("reset in %v, past the bound of %v", q.Reset.Round(time.Second), maxQuotaReset)
	}
	return ""
}

// parseDraftQuota reads the draft's RateLimit field ("default";r=50;t=30),
// and its limit from the RateLimit-Policy item of the same name
// ("default";q=100;w=60); why is "" when they make a quota.
func parseDraftQuota(rl string, policies []string) (q Quota, why string) {
	name, params := sfItem(rl)
	r, okR := nonNegative(params["r"])
	t, okT := nonNegative(params["t"])
	if !okR || !okT {
		return Quota{}, "r or t is not a number of at most 15 digits"
	}
	q = Quota{Remaining: r, Reset: time.Duration(t) * time.Second, Partition: name, Source: "RateLimit"}
	if name == "default" {
		q.Partition = ""
	}
	if pk := params["pk"]; pk != "" {
		q.Partition = strings.Trim(pk, ":")
	}
	pp := policyItem(policies, name)
	if pp == nil {
		return Quota{}, "no RateLimit-Policy item of the same name, so no limit"
	}
	limit, ok := nonNegative(pp["q"])
	if !ok {
		return Quota{}, "the policy's q is not a number of at most 15 digits"
	}
	q.Limit = limit
	if why := q.inconsistent(); why != "" {
		return Quota{}, why
	}
	if wv, said := pp["w"]; said {
		w, ok := nonNegative(wv)
		window := time.Duration(w) * time.Second
		switch {
		case !ok:
			return Quota{}, "the policy's w is not a number of at most 15 digits"
		case w < 1 || window > maxQuotaReset:
			return Quota{}, fmt.Sprintf("window %ds, outside 1s to %v", w, maxQuotaReset)
		case q.Reset > window:
			return Quota{}, fmt.Sprintf("reset in %v past its window of %v", q.Reset, window)
		}
	}
	return q, ""
}

// policyItem is the parameters of the first RateLimit-Policy item named
// name in policies (the field's lines); nil if none is.
func policyItem(policies []string, name string) map[string]string {
	for _, policy := range policies {
		for item := range strings.SplitSeq(policy, ",") {
			if pname, p := sfItem(item); pname == name {
				return p
			}
		}
	}
	return nil
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
func RateLimited(resp *Response) bool {
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
		return saysSpent(resp.Header)
	}
	return false
}

// saysSpent reports whether h says no request is left, whatever else it
// says: X-RateLimit-Remaining: 0, or the draft's RateLimit with r=0. A
// 403 that says so is a rate limit even when the rest of its quota is not
// believed (RateLimited); nothing is learned from it then.
func saysSpent(h http.Header) bool {
	if rl := h.Get("RateLimit"); rl != "" {
		_, params := sfItem(rl)
		r, ok := nonNegative(params["r"])
		return ok && r == 0
	}
	r, ok := nonNegative(h.Get("X-RateLimit-Remaining"))
	return ok && r == 0
}
