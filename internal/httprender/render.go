// Package httprender is the one rendering of a coordd answer as an HTTP
// response, which the HTTP door (server) and the Go drop-in
// (clients/go.NewTransport) both follow, as the TypeScript and Python
// drop-ins do in their own language: a document's status and X-Coordd-*
// fields, and an error's status, Retry-After and JSON body. docs/api.md
// ("One rendering") writes the mapping down; testdata/http-rendering holds
// a case for every row of it, which every implementation's tests read.
//
// It also names the reasons coordd gives in a google.rpc.ErrorInfo detail
// (domain Domain) to the errors a client acts on, so that no client reads
// an error's message.
package httprender

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// Domain is the domain of coordd's google.rpc.ErrorInfo details.
const Domain = "coordd"

// The reasons of coordd's ErrorInfo details.
const (
	// ReasonOutsideUpstreams: the url is outside every configured
	// upstream (PERMISSION_DENIED). A drop-in does not carry such a
	// request; its fallback may.
	ReasonOutsideUpstreams = "OUTSIDE_UPSTREAMS"
	// ReasonCallerCredentialsRefused: the request carries the caller's own
	// credential and its upstream does not accept one (PERMISSION_DENIED).
	// A drop-in does not carry it either.
	ReasonCallerCredentialsRefused = "CALLER_CREDENTIALS_REFUSED"
	// ReasonNotGranted: the tenant is not granted the upstream
	// (PERMISSION_DENIED). A refusal, never a fallback's.
	ReasonNotGranted = "NOT_GRANTED"
	// ReasonRateLimited: no rate-limit slot before the deadline
	// (RESOURCE_EXHAUSTED, with a RetryInfo).
	ReasonRateLimited = "RATE_LIMITED"
	// ReasonBreakerOpen: the upstream's circuit breaker is open
	// (UNAVAILABLE, with a RetryInfo).
	ReasonBreakerOpen = "BREAKER_OPEN"
	// ReasonUpstreamUnavailable: the upstream failed and no usable stale
	// copy exists (UNAVAILABLE).
	ReasonUpstreamUnavailable = "UPSTREAM_UNAVAILABLE"
	// ReasonTooLarge: the body is over the upstream's max_body_bytes
	// (FAILED_PRECONDITION).
	ReasonTooLarge = "TOO_LARGE"
)

// NotCarried reports whether reason says a drop-in does not carry the
// request (it goes to the drop-in's fallback, if any).
func NotCarried(reason string) bool {
	return reason == ReasonOutsideUpstreams || reason == ReasonCallerCredentialsRefused
}

// Response header fields of a coordd answer besides the standard ones.
const (
	// SourceHeader: where the document came from, l1, l2 or upstream.
	SourceHeader = "X-Coordd-Source"
	// StaleHeader: true when the copy is stale (served
	// stale-while-revalidate or stale-if-error), else false.
	StaleHeader = "X-Coordd-Stale"
	// AgeHeader: seconds since coordd fetched the copy (as Age).
	AgeHeader = "X-Coordd-Age"
	// KeyHeader: the document's cache key.
	KeyHeader = "X-Coordd-Key"
	// UpstreamHeader: the configured upstream that serves the url.
	UpstreamHeader = "X-Coordd-Upstream"
	// ErrorHeader: on an error answer, its status name and message.
	ErrorHeader = "X-Coordd-Error"
)

// Owned reports whether coordd sets the field name (canonical form) on a
// document's answer itself, never copying the upstream's.
func Owned(name string) bool {
	switch name {
	case "Content-Type", "Etag", "Last-Modified", "Cache-Control", "Age", "Content-Length",
		SourceHeader, StaleHeader, AgeHeader, KeyHeader, UpstreamHeader, ErrorHeader:
		return true
	}
	return false
}

// Document is what coordd says of a document: the fields of its metadata.
type Document struct {
	StatusCode   int
	ContentType  string
	ETag         string
	LastModified string
	Size         int64
	Age          time.Duration
	Source       string // l1, l2 or upstream
	Stale        bool
	Key          string
	Upstream     string
	CacheControl string
}

// FromMetadata is what md says of its document.
func FromMetadata(md *coorddv1.Metadata) Document {
	return Document{
		StatusCode: int(md.GetStatusCode()), ContentType: md.GetContentType(), ETag: md.GetEtag(),
		LastModified: md.GetLastModified(), Size: md.GetSize(), Age: md.GetAge().AsDuration(),
		Source: SourceName(md.GetSource()), Stale: md.GetStale(), Key: md.GetKey(), Upstream: md.GetUpstream(),
		CacheControl: md.GetCacheControl(),
	}
}

// SourceName is the value of SourceHeader for src: l1, l2, upstream, or
// "" for none.
func SourceName(src coorddv1.Source) string {
	switch src {
	case coorddv1.Source_SOURCE_L1:
		return "l1"
	case coorddv1.Source_SOURCE_L2:
		return "l2"
	case coorddv1.Source_SOURCE_UPSTREAM:
		return "upstream"
	}
	return ""
}

// SetDocument sets d's fields in h (after the upstream's, which the caller
// copies without the Owned ones) and returns the answer's status: the
// upstream's, or 502 for one outside 200–599 (coordd never delivers a
// 1xx).
func SetDocument(h http.Header, d Document) int {
	if d.ContentType != "" {
		h.Set("Content-Type", d.ContentType)
	}
	if d.ETag != "" {
		h.Set("Etag", d.ETag)
	}
	if d.LastModified != "" {
		h.Set("Last-Modified", d.LastModified)
	}
	if d.CacheControl != "" {
		h.Set("Cache-Control", d.CacheControl)
	}
	h.Set("Content-Length", strconv.FormatInt(d.Size, 10))
	age := strconv.FormatInt(int64(max(0, d.Age)/time.Second), 10) // whole seconds, rounded down, as HTTP's Age
	h.Set("Age", age)
	h.Set(AgeHeader, age)
	if d.Source != "" {
		h.Set(SourceHeader, d.Source)
	}
	h.Set(StaleHeader, strconv.FormatBool(d.Stale))
	if d.Key != "" {
		h.Set(KeyHeader, d.Key)
	}
	if d.Upstream != "" {
		h.Set(UpstreamHeader, d.Upstream)
	}
	if d.StatusCode < 200 || d.StatusCode > 599 {
		return http.StatusBadGateway
	}
	return d.StatusCode
}

// Error is a coordd error as its answer says it.
type Error struct {
	Code    codes.Code
	Message string
	Reason  string        // ErrorInfo's, when its domain is Domain
	Wait    time.Duration // RetryInfo's delay, 0 without one
}

// FromStatus reads st's code, message, coordd reason and RetryInfo.
func FromStatus(st *status.Status) Error {
	e := Error{Code: st.Code(), Message: st.Message()}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			e.Wait = d.GetRetryDelay().AsDuration()
		case *errdetails.ErrorInfo:
			if d.GetDomain() == Domain {
				e.Reason = d.GetReason()
			}
		}
	}
	return e
}

// StatusOf is the HTTP status for a gRPC code.
func StatusOf(c codes.Code) int {
	switch c {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.FailedPrecondition:
		return http.StatusRequestEntityTooLarge // the body is over max_body_bytes
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Canceled:
		return 499 // the caller closed the request; no one reads it
	case codes.Unimplemented:
		return http.StatusMethodNotAllowed
	}
	return http.StatusInternalServerError
}

// Answered reports whether a drop-in answers an error of code c as an HTTP
// response (coordd cannot deliver the document now: the caller's code
// checks the status as against the upstream) rather than failing the
// request with an error.
func Answered(c codes.Code) bool {
	return c == codes.Unavailable || c == codes.ResourceExhausted || c == codes.DeadlineExceeded
}

// Name is c's name as in google.rpc.Code: PERMISSION_DENIED.
func Name(c codes.Code) string { return code.Code(c).String() }

// maxErrorHeader bounds the value of ErrorHeader.
const maxErrorHeader = 1024

// ErrorBody is the JSON body of an error answer:
//
//	{"message": "coordd: RESOURCE_EXHAUSTED: …",
//	 "error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "reason": "RATE_LIMITED",
//	           "message": "…", "retry_after_seconds": 2}}
//
// error is the shape of Google's HTTP APIs' errors; the top-level message
// is where GitHub's and many other APIs put theirs.
type ErrorBody struct {
	Message string      `json:"message"`
	Error   ErrorDetail `json:"error"`
}

// ErrorDetail is ErrorBody's error.
type ErrorDetail struct {
	Code       int    `json:"code"`
	Status     string `json:"status"`
	Reason     string `json:"reason,omitempty"`
	Message    string `json:"message"`
	RetryAfter int64  `json:"retry_after_seconds,omitempty"`
}

// SetError sets e's fields in h and returns its status (httpStatus, when
// not 0, instead of StatusOf's: the door's own refusals choose theirs) and
// body. A 429 or 503 carries Retry-After: the RetryInfo delay in whole
// seconds, rounded up (never sooner than coordd asked), 1 without one.
func SetError(h http.Header, e Error, httpStatus int) (int, []byte) {
	if httpStatus == 0 {
		httpStatus = StatusOf(e.Code)
	}
	name := Name(e.Code)
	d := ErrorDetail{Code: httpStatus, Status: name, Reason: e.Reason, Message: e.Message}
	if httpStatus == http.StatusTooManyRequests || httpStatus == http.StatusServiceUnavailable {
		d.RetryAfter = max(int64(math.Ceil(e.Wait.Seconds())), 1)
		h.Set("Retry-After", strconv.FormatInt(d.RetryAfter, 10))
	}
	if e.Code == codes.Unauthenticated {
		h.Set("WWW-Authenticate", `Bearer realm="coordd"`)
	}
	b, _ := json.Marshal(ErrorBody{Message: "coordd: " + name + ": " + e.Message, Error: d}) // plain strings and numbers: never fails
	b = append(b, '\n')
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set(ErrorHeader, headerValue(name+": "+e.Message))
	return httpStatus, b
}

// headerValue is v fit for a header value: control characters replaced by
// spaces, and at most maxErrorHeader bytes.
func headerValue(v string) string {
	v = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, v)
	if len(v) > maxErrorHeader {
		v = strings.ToValidUTF8(v[:maxErrorHeader], "")
	}
	return v
}
