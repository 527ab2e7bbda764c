package clientconformance

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// URLHost is the host of the urls runners ask for:
// http://conformance.test/CASE/RUN, where RUN tells apart the calls of one
// case (one per runner, say).
const URLHost = "conformance.test"

// Server is a fake coordd that plays the corpus's cases on loopback: a
// GetOrFetch for http://conformance.test/CASE/RUN plays attempt n of CASE's
// script on the nth call for that url. Its control endpoint reports what
// it saw for a url (see Record). Close stops it.
type Server struct {
	cases   map[string]Case
	start   time.Time // Record's times are monotonic offsets from it
	lis     *trackingListener
	grpc    *grpc.Server
	control *http.Server
	ctlAddr string

	mu   sync.Mutex // protects runs
	runs map[string]*run
}

// run is what the server saw of one url.
type run struct {
	starts, ends []time.Duration // per attempt; an end is when its status was sent or its connection cut
	priorities   []string        // per attempt: the request's priority, by name
	problems     []string
}

// Record is what the server saw of the calls for one url.
type Record struct {
	// Attempts is how many GetOrFetch calls arrived.
	Attempts int `json:"attempts"`
	// GapsMs[i] is the time from the end of attempt i+1 to the start of
	// attempt i+2, in milliseconds.
	GapsMs []float64 `json:"gaps_ms"`
	// Priorities[i] is the priority the request of attempt i+1 carried, by
	// name ("PRIORITY_BACKGROUND"; a value the protocol does not know, by
	// number).
	Priorities []string `json:"priorities"`
	// Problems are calls the server could not play: an unknown case, an
	// attempt beyond the script. A runner fails on any.
	Problems []string `json:"problems"`
}

// Start serves cases on two loopback ports, one for gRPC and one for the
// control endpoint.
func Start(c *Corpus) (*Server, error) {
	s := &Server{cases: map[string]Case{}, start: time.Now(), runs: map[string]*run{}}
	for _, cs := range c.Cases {
		s.cases[cs.Name] = cs
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("clientconformance: %w", err)
	}
	ctl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		lis.Close()
		return nil, fmt.Errorf("clientconformance: %w", err)
	}
	s.lis = &trackingListener{Listener: lis, conns: map[string]*trackedConn{}}
	s.grpc = grpc.NewServer()
	coorddv1.RegisterCoordinatorServiceServer(s.grpc, service{s: s})
	hs := health.NewServer() // the Go client checks the service's health
	hs.SetServingStatus(coorddv1.CoordinatorService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s.grpc, hs)
	s.control = &http.Server{Handler: http.HandlerFunc(s.serveControl), ReadHeaderTimeout: 5 * time.Second}
	s.ctlAddr = ctl.Addr().String()
	go func() { _ = s.grpc.Serve(s.lis) }()
	go func() { _ = s.control.Serve(ctl) }()
	return s, nil
}

// Addr is the gRPC address, host:port.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// ControlURL is the control endpoint: GET ControlURL()?url=URL answers the
// Record of URL as JSON.
func (s *Server) ControlURL() string { return "http://" + s.ctlAddr + "/record" }

// Close stops both servers at once.
func (s *Server) Close() {
	s.grpc.Stop()
	_ = s.control.Close()
}

// Record returns what the server saw of the calls for u.
func (s *Server) Record(u string) Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := Record{GapsMs: []float64{}, Priorities: []string{}, Problems: []string{}}
	rn := s.runs[u]
	if rn == nil {
		return r
	}
	r.Attempts = len(rn.starts)
	for i := 1; i < len(rn.starts); i++ {
		gap := rn.starts[i] - rn.ends[i-1]
		r.GapsMs = append(r.GapsMs, float64(gap)/float64(time.Millisecond))
	}
	r.Priorities = append(r.Priorities, rn.priorities...)
	r.Problems = append(r.Problems, rn.problems...)
	return r
}

func (s *Server) serveControl(w http.ResponseWriter, r *http.Request) {
	u := r.URL.Query().Get("url")
	if r.URL.Path != "/record" || u == "" {
		http.Error(w, "GET /record?url=URL", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.Record(u))
}

// begin records the start of an attempt for u, whose request carried
// priority, and returns its number (from 1), and the case to play, or a
// problem.
func (s *Server) begin(u string, priority coorddv1.Priority) (int, Case, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rn := s.runs[u]
	if rn == nil {
		rn = &run{}
		s.runs[u] = rn
	}
	rn.starts = append(rn.starts, time.Since(s.start))
	rn.ends = append(rn.ends, time.Since(s.start)) // until end says otherwise
	rn.priorities = append(rn.priorities, priority.String())
	n := len(rn.starts)
	cs, err := s.caseOf(u)
	if err == nil && n > len(cs.Attempts) {
		err = fmt.Errorf("attempt %d of case %q is not scripted (%d are)", n, cs.Name, len(cs.Attempts))
	}
	if err != nil {
		rn.problems = append(rn.problems, err.Error())
	}
	return n, cs, err
}

// end records the end of attempt n for u.
func (s *Server) end(u string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs[u].ends[n-1] = time.Since(s.start)
}

func (s *Server) caseOf(u string) (Case, error) {
	p, err := url.Parse(u)
	if err != nil || p.Host != URLHost {
		return Case{}, fmt.Errorf("url %q: want http://%s/CASE/RUN", u, URLHost)
	}
	name, _, _ := strings.Cut(strings.TrimPrefix(p.Path, "/"), "/")
	cs, ok := s.cases[name]
	if !ok {
		return Case{}, fmt.Errorf("no case %q in the corpus", name)
	}
	return cs, nil
}

// service is the scripted CoordinatorService.
type service struct {
	coorddv1.UnimplementedCoordinatorServiceServer
	s *Server
}

func (sv service) GetOrFetch(req *coorddv1.GetOrFetchRequest, st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
	s := sv.s
	u := req.GetUrl()
	conn := s.lis.conn(st.Context())
	if conn.wasCut() {
		// A call sent on a connection this server already cut, before the
		// client saw the cut: the client's, not the script's, attempt.
		// It cannot be answered (the write side is shut): it is not
		// counted, and the connection is closed for good so that the
		// client fails it at once and moves on to a new one.
		_ = conn.Conn.Close()
		return status.Error(codes.Unavailable, "clientconformance: connection already cut")
	}
	n, cs, err := s.begin(u, req.GetPriority())
	if err != nil {
		return status.Error(codes.Aborted, "clientconformance: "+err.Error())
	}
	conn.record()
	var last []byte // the last message sent, as framed on the wire
	for _, step := range cs.Attempts[n-1] {
		var ev *coorddv1.GetOrFetchResponse
		switch {
		case step.Progress != "":
			ev = &coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Progress{Progress: &coorddv1.Progress{
				Role:  coorddv1.Role_ROLE_LEADER,
				Stage: coorddv1.Stage(coorddv1.Stage_value[step.Progress]),
			}}}
		case step.Metadata != nil:
			m := step.Metadata
			ev = &coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Metadata{Metadata: &coorddv1.Metadata{
				StatusCode: m.StatusCode, Size: m.Size, ContentType: m.ContentType, Etag: m.ETag,
			}}}
		case step.Chunk != nil:
			ev = &coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: &coorddv1.Chunk{Data: []byte(*step.Chunk)}}}
		case step.UnknownEvent:
			ev = &coorddv1.GetOrFetchResponse{}
			ev.ProtoReflect().SetUnknown(unknownEvent)
		case step.Status != nil:
			defer s.end(u, n)
			return statusOf(*step.Status)
		case step.Cut:
			// Let what was sent reach the socket first, so that "cut after
			// the metadata" means the client had the metadata.
			conn.waitWritten(last, 2*time.Second)
			s.end(u, n)
			conn.cut()
			return status.Error(codes.Unavailable, "clientconformance: connection cut")
		}
		if err := st.Send(ev); err != nil {
			return err
		}
		last = frame(ev)
	}
	defer s.end(u, n)
	return nil
}

// unknownEvent is field 15 of GetOrFetchResponse, a message holding a
// string: an event this protocol does not have (yet).
var unknownEvent = protowire.AppendString(protowire.AppendTag(nil, 15, protowire.BytesType), "from the future")

// frame is msg as a gRPC message on the wire: uncompressed, its length,
// then its bytes. An HTTP/2 DATA frame carries it whole when it is short.
func frame(msg proto.Message) []byte {
	b, _ := proto.Marshal(msg)
	out := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(out[1:], uint32(len(b)))
	return append(out, b...)
}

func statusOf(st Status) error {
	msg := st.Message
	if msg == "" {
		msg = "scripted " + codeName(st.Code)
	}
	s := status.New(st.Code, msg)
	if st.RetryDelayMs > 0 {
		d, err := s.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(st.RetryDelayMs) * time.Millisecond)})
		if err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		s = d
	}
	return s.Err()
}

// codeName is code's canonical name, such as RESOURCE_EXHAUSTED.
func codeName(code codes.Code) string {
	if code == codes.Canceled {
		return "CANCELLED" // the one name that is not String() in upper snake case
	}
	var b strings.Builder
	for i, r := range code.String() {
		if i > 0 && unicode.IsUpper(r) && code != codes.OK {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// trackingListener remembers its connections by remote address, so that a
// handler can cut its own.
type trackingListener struct {
	net.Listener

	mu    sync.Mutex // protects conns
	conns map[string]*trackedConn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c}
	tc.cond = sync.NewCond(&tc.mu)
	l.mu.Lock()
	l.conns[c.RemoteAddr().String()] = tc
	l.mu.Unlock()
	return tc, nil
}

// conn returns the connection of the call whose context is ctx.
func (l *trackingListener) conn(ctx context.Context) *trackedConn {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[p.Addr.String()]
}

// trackedConn records the bytes written to it since record, so that a
// handler can wait for its messages to reach the socket.
type trackedConn struct {
	net.Conn

	mu         sync.Mutex // protects rec
	cond       *sync.Cond // signalled on each write
	rec        []byte
	wasCutFlag atomic.Bool // cut has run
}

// wasCut reports whether cut has run on c.
func (c *trackedConn) wasCut() bool { return c != nil && c.wasCutFlag.Load() }

func (c *trackedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.mu.Lock()
	c.rec = append(c.rec, b[:n]...)
	c.mu.Unlock()
	c.cond.Broadcast()
	return n, err
}

// record forgets what was written so far.
func (c *trackedConn) record() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rec = nil
}

// waitWritten waits until b has been written since record, or for
// timeout. An empty b is there at once.
func (c *trackedConn) waitWritten(b []byte, timeout time.Duration) {
	if c == nil {
		return
	}
	expired := false // guarded by c.mu
	t := time.AfterFunc(timeout, func() {
		c.mu.Lock()
		expired = true
		c.mu.Unlock()
		c.cond.Broadcast()
	})
	defer t.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for !bytes.Contains(c.rec, b) && !expired {
		c.cond.Wait()
	}
}

// cut ends the connection as a process that dies would, but in order:
// it sends a FIN, not a reset, so that the client reads everything written
// before it (a reset may discard what the client has not read yet), then
// sees the connection end.
func (c *trackedConn) cut() {
	if c == nil {
		return
	}
	c.wasCutFlag.Store(true)
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = c.Conn.Close()
}
