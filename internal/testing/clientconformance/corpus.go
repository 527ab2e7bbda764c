// Package clientconformance holds the client conformance corpus
// (testdata/client-conformance) and a scripted fake coordd that plays its
// cases, so that the Go, TypeScript and Python clients are tested against
// one account of how a GetOrFetch stream is reassembled and when a call is
// retried. The corpus's README states the rules; each client's runner
// loads every case, calls the fake and asserts the case's outcome.
package clientconformance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"google.golang.org/grpc/codes"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// CorpusFile is the corpus's file name inside its directory.
const CorpusFile = "cases.json"

// Corpus is the parsed cases.json.
type Corpus struct {
	// Cases are the cases, in the file's order.
	Cases []Case
}

// Case is one scripted exchange and the outcome every client must reach.
type Case struct {
	// Name names the case; it is the first path segment of the url a
	// runner asks for, which is how the fake knows what to play.
	Name string `json:"name"`
	// About says what the case checks.
	About string `json:"about"`
	// Client is the client's configuration: the corpus's defaults with the
	// case's own fields over them.
	Client ClientConfig `json:"client"`
	// Call is the call's own options.
	Call CallConfig `json:"call"`
	// Attempts scripts the server's behaviour, one list of steps per
	// attempt, in order. An attempt beyond the script is answered with
	// ABORTED and reported as a problem.
	Attempts [][]Step `json:"attempts"`
	// Want is the outcome.
	Want Want `json:"want"`
}

// ClientConfig is how a runner configures its client for a case.
type ClientConfig struct {
	// MaxAttempts is the most attempts per call, the first included.
	MaxAttempts int `json:"max_attempts"`
	// InitialBackoffMs bounds the jittered wait before the first retry.
	InitialBackoffMs int64 `json:"initial_backoff_ms"`
	// MaxBackoffMs caps the bound of any jittered wait.
	MaxBackoffMs int64 `json:"max_backoff_ms"`
	// TimeoutMs is the call's deadline, every attempt and wait included.
	TimeoutMs int64 `json:"timeout_ms"`
	// MaxBodyBytes is the largest body the client accepts; 0: no limit.
	MaxBodyBytes int64 `json:"max_body_bytes"`
}

// CallConfig is how a runner makes its call for a case.
type CallConfig struct {
	// Priority, if set, is the priority the runner gives the call, as the
	// client names it: "interactive" or "background".
	Priority string `json:"priority,omitempty"`
}

// Step is one thing the server does in an attempt: exactly one field is
// set. Status and Cut end the attempt and come last; an attempt without
// either ends with OK.
type Step struct {
	// Progress sends a progress event at this stage (a coordd.v1.Stage
	// name, such as "STAGE_FETCHING").
	Progress string `json:"progress,omitempty"`
	// Metadata sends the metadata event.
	Metadata *Metadata `json:"metadata,omitempty"`
	// Chunk sends a chunk of these bytes (the string's UTF-8).
	Chunk *string `json:"chunk,omitempty"`
	// UnknownEvent sends a message whose event is none the client knows: a
	// field outside the oneof, as an event added to the protocol later
	// would reach a client built before it.
	UnknownEvent bool `json:"unknown_event,omitempty"`
	// Status ends the attempt with this status.
	Status *Status `json:"status,omitempty"`
	// Cut ends the attempt by closing the connection, once the steps
	// before it have been written to it, as an instance that dies would.
	Cut bool `json:"cut,omitempty"`
}

// Metadata is a scripted metadata event.
type Metadata struct {
	StatusCode  int32  `json:"status_code"`
	Size        int64  `json:"size"`
	ContentType string `json:"content_type,omitempty"`
	ETag        string `json:"etag,omitempty"`
}

// Status is a scripted final status.
type Status struct {
	// Code is the status code, by its canonical name ("UNAVAILABLE").
	Code codes.Code `json:"code"`
	// Message is the status message. Default: "scripted CODE".
	Message string `json:"message,omitempty"`
	// RetryDelayMs, if positive, adds a google.rpc.RetryInfo detail with
	// this retry_delay.
	RetryDelayMs int64 `json:"retry_delay_ms,omitempty"`
}

// Want is a case's outcome: a Document or an Error, the number of attempts
// the server saw, and lower bounds on the waits between them.
type Want struct {
	// Document is the document the call returns.
	Document *Document `json:"document,omitempty"`
	// Error is the call's error: a gRPC code's canonical name
	// ("RESOURCE_EXHAUSTED"), or ErrBadStream or ErrBodyTooLarge.
	Error string `json:"error,omitempty"`
	// Attempts is how many attempts reach the server.
	Attempts int `json:"attempts"`
	// MinGapsMs[i], if given, is the least time between the end of
	// attempt i+1 (its status sent, or its connection cut) and the start of
	// attempt i+2, as the server sees them. Lower bounds only: a busy
	// machine may always wait longer.
	MinGapsMs []int64 `json:"min_gaps_ms,omitempty"`
	// Priority is the coordd.v1.Priority every attempt's request carries,
	// by name. Default: PRIORITY_UNSPECIFIED (the call sends none).
	Priority string `json:"priority,omitempty"`
}

// WantPriority is the priority every attempt of c must carry, by name.
func (c *Case) WantPriority() string {
	if c.Want.Priority == "" {
		return coorddv1.Priority_PRIORITY_UNSPECIFIED.String()
	}
	return c.Want.Priority
}

// The client's own errors, as Want.Error names them.
const (
	// ErrBadStream is a stream that broke the protocol (Go: ErrBadStream;
	// TypeScript: INTERNAL "malformed GetOrFetch stream"; Python: BadStream).
	ErrBadStream = "bad_stream"
	// ErrBodyTooLarge is a metadata size above the client's limit (Go:
	// ErrBodyTooLarge; TypeScript: BodyTooLargeError; Python: BodyTooLarge).
	ErrBodyTooLarge = "body_too_large"
)

// Document is a reassembled document as a case expects it.
type Document struct {
	Body        string `json:"body"`
	StatusCode  int32  `json:"status_code"`
	ContentType string `json:"content_type"`
	ETag        string `json:"etag"`
	// Progress is the stages of the progress events of the attempt that
	// produced the document, in order.
	Progress []string `json:"progress"`
}

// file is cases.json as written.
type file struct {
	Comment string            `json:"comment"`
	Client  ClientConfig      `json:"client"`
	Cases   []json.RawMessage `json:"cases"`
}

var caseName = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)

// Load reads and checks dir/cases.json. Any field it does not know, in any
// case, fails it: a runner never skips what it cannot read.
func Load(dir string) (*Corpus, error) {
	raw, err := os.ReadFile(filepath.Join(dir, CorpusFile))
	if err != nil {
		return nil, fmt.Errorf("clientconformance: %w", err)
	}
	var f file
	if err := strict(raw, &f); err != nil {
		return nil, fmt.Errorf("clientconformance: %s: %w", CorpusFile, err)
	}
	if len(f.Cases) == 0 {
		return nil, fmt.Errorf("clientconformance: %s has no cases", CorpusFile)
	}
	c := &Corpus{}
	seen := map[string]bool{}
	for i, rc := range f.Cases {
		cs := Case{Client: f.Client} // the case's client fields land over the defaults
		if err := strict(rc, &cs); err != nil {
			return nil, fmt.Errorf("clientconformance: case %d: %w", i, err)
		}
		if err := cs.validate(); err != nil {
			return nil, fmt.Errorf("clientconformance: case %d (%s): %w", i, cs.Name, err)
		}
		if seen[cs.Name] {
			return nil, fmt.Errorf("clientconformance: case %q appears twice", cs.Name)
		}
		seen[cs.Name] = true
		c.Cases = append(c.Cases, cs)
	}
	return c, nil
}

func strict(raw []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

func (c *Case) validate() error {
	if !caseName.MatchString(c.Name) {
		return fmt.Errorf("name %q: want lower-case words joined by -", c.Name)
	}
	if c.About == "" {
		return fmt.Errorf("about is empty")
	}
	if c.Client.MaxAttempts < 1 || c.Client.TimeoutMs < 1 || c.Client.MaxBackoffMs < c.Client.InitialBackoffMs {
		return fmt.Errorf("client %+v: want max_attempts and timeout_ms positive, max_backoff_ms >= initial_backoff_ms", c.Client)
	}
	if len(c.Attempts) == 0 {
		return fmt.Errorf("no attempts scripted")
	}
	for i, a := range c.Attempts {
		for j, s := range a {
			if err := s.validate(j == len(a)-1); err != nil {
				return fmt.Errorf("attempt %d, step %d: %w", i+1, j+1, err)
			}
		}
	}
	w := c.Want
	if (w.Document == nil) == (w.Error == "") {
		return fmt.Errorf("want: give exactly one of document and error")
	}
	if w.Error != "" && w.Error != ErrBadStream && w.Error != ErrBodyTooLarge {
		var code codes.Code
		if err := code.UnmarshalJSON([]byte(`"` + w.Error + `"`)); err != nil || code == codes.OK {
			return fmt.Errorf("want.error %q: not a gRPC code name, %s or %s", w.Error, ErrBadStream, ErrBodyTooLarge)
		}
	}
	if w.Document != nil {
		for _, p := range w.Document.Progress {
			if _, ok := coorddv1.Stage_value[p]; !ok {
				return fmt.Errorf("want.document.progress: unknown stage %q", p)
			}
		}
	}
	switch c.Call.Priority {
	case "", "interactive", "background":
	default:
		return fmt.Errorf("call.priority %q: want interactive or background", c.Call.Priority)
	}
	if _, ok := coorddv1.Priority_value[c.WantPriority()]; !ok {
		return fmt.Errorf("want.priority: unknown priority %q", w.Priority)
	}
	if w.Attempts < 1 || w.Attempts > len(c.Attempts) {
		return fmt.Errorf("want.attempts %d: want 1 to the %d scripted", w.Attempts, len(c.Attempts))
	}
	if len(w.MinGapsMs) > w.Attempts-1 {
		return fmt.Errorf("want.min_gaps_ms: %d gaps for %d attempts", len(w.MinGapsMs), w.Attempts)
	}
	return nil
}

func (s Step) validate(last bool) error {
	n := 0
	for _, set := range []bool{s.Progress != "", s.Metadata != nil, s.Chunk != nil, s.UnknownEvent, s.Status != nil, s.Cut} {
		if set {
			n++
		}
	}
	switch {
	case n != 1:
		return fmt.Errorf("want exactly one of progress, metadata, chunk, unknown_event, status, cut; got %d", n)
	case (s.Status != nil || s.Cut) && !last:
		return fmt.Errorf("status and cut end an attempt: nothing may follow them")
	case s.Status != nil && s.Status.Code == codes.OK:
		return fmt.Errorf("status OK: leave the status out instead")
	}
	if s.Progress != "" {
		if _, ok := coorddv1.Stage_value[s.Progress]; !ok {
			return fmt.Errorf("progress: unknown stage %q", s.Progress)
		}
	}
	return nil
}
