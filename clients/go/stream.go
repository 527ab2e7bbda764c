package coordd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// errBodyClosed is what Read returns once the body is closed, as net/http's
// "read on closed response body".
var errBodyClosed = errors.New("coordd: read on closed response body")

// stream is a GetOrFetch stream whose metadata has arrived: the document's
// body is read from it as its chunks arrive, each chunk's data copied once,
// from gRPC's receive buffers into the reader's buffer (see recvCodec).
//
// It is an io.ReadCloser. Read must not be called concurrently with
// itself; Close may be called at any time, from any goroutine, including
// while a Read waits for the next chunk: it cancels the stream, so coordd
// stops sending, and that Read returns. Reaching the end of the body, or an
// error, also releases the stream.
type stream struct {
	md     *coorddv1.Metadata
	st     grpc.ClientStream  // received through recvCodec
	cancel context.CancelFunc // ends the stream and the call's deadline
	// ctx is the call's context, whose end tells a cancellation from a
	// failure (the stream's own context ends with any failure). Held as
	// gRPC's streams hold theirs: the stream lives as long as the call.
	ctx context.Context

	mu      sync.Mutex      // protects the fields below
	closed  bool            // Close was called
	err     error           // sticky: io.EOF at the end, or the failure
	raw     mem.BufferSlice // the chunk being read, in wire form; owned, nil when none
	off     int             // offset in raw of its next unread byte
	left    int             // unread bytes of raw's data
	pending []byte          // unread data of a chunk decoded as protobuf (another shape)
	got     int64           // body bytes received so far
}

// open makes a GetOrFetch call for req and returns its stream as soon as
// the metadata arrives, retrying per the Client's RetryPolicy and circuit
// breaker until then; once the metadata has arrived nothing is retried,
// since the caller may already have acted on it. For req.Head the call is
// over when open returns: the stream holds no body.
//
// The call's deadline is ctx's, or the Client's default (WithTimeout), and
// it covers the reading of the body too. The caller must Close the stream,
// or read it to its end, to release the call.
func (c *Client) open(ctx context.Context, req *coorddv1.GetOrFetchRequest) (*stream, error) {
	ctx, cancel := c.withDeadline(ctx)
	var s *stream
	err := c.do(ctx, func(ctx context.Context) error {
		var err error
		s, err = c.openOnce(ctx, req)
		return err
	})
	if err != nil {
		cancel()
		return nil, err
	}
	attemptCancel := s.cancel
	s.cancel = func() {
		attemptCancel()
		cancel()
	}
	if req.GetHead() {
		s.cancel()
	}
	return s, nil
}

// openOnce makes one GetOrFetch attempt and receives its stream up to the
// metadata (for a HEAD, to its end). A failed attempt leaves nothing
// behind: its stream is cancelled.
func (c *Client) openOnce(ctx context.Context, req *coorddv1.GetOrFetchRequest) (_ *stream, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		if err != nil {
			cancel()
		}
	}()
	st, err := c.api.GetOrFetch(ctx, req, recvCodecOption)
	if err != nil {
		return nil, err
	}
	var md *coorddv1.Metadata
	for md == nil {
		m, err := recvDecoded(st.RecvMsg)
		if errors.Is(err, io.EOF) {
			return nil, badStream("stream ended without metadata")
		}
		if err != nil {
			return nil, err
		}
		switch ev := m.GetEvent().(type) {
		case *coorddv1.GetOrFetchResponse_Metadata:
			md = ev.Metadata
		case *coorddv1.GetOrFetchResponse_Chunk:
			return nil, badStream("chunk before metadata")
		}
	}
	if size := md.GetSize(); size < 0 {
		return nil, badStream(fmt.Sprintf("metadata says size %d", size))
	}
	if req.GetHead() {
		// coordd ends the stream after the metadata: reading its end lets
		// the call finish as coordd finished it rather than as cancelled.
		// A coordd older than head sends the body: open cancels it.
		var r response
		if err := st.RecvMsg(&r); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		r.raw.Free()
	}
	return &stream{md: md, st: st, cancel: cancel, ctx: ctx}, nil
}

// recvDecoded receives the next message decoded as protobuf, chunks
// included: for the messages before the metadata, where a chunk is an
// error anyway.
func recvDecoded(recvMsg func(any) error) (*coorddv1.GetOrFetchResponse, error) {
	var r response
	if err := recvMsg(&r); err != nil {
		return nil, err
	}
	if r.raw == nil {
		return r.msg, nil
	}
	defer r.raw.Free()
	m := new(coorddv1.GetOrFetchResponse)
	if err := proto.Unmarshal(r.raw.Materialize(), m); err != nil {
		return nil, badStream(fmt.Sprintf("undecodable message: %v", err))
	}
	return m, nil
}

// Read reads the body as it arrives. It returns io.EOF once the body the
// metadata announced has arrived and the stream ended; an error wrapping
// ErrBadStream if the stream breaks the protocol; one wrapping
// io.ErrUnexpectedEOF and the gRPC status if the stream fails before the
// whole body arrived; the context's error if the call's context ended.
func (s *stream) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		s.mu.Lock()
		switch {
		case s.closed:
			s.mu.Unlock()
			return 0, errBodyClosed
		case s.left > 0 || len(s.pending) > 0:
			n := s.take(p)
			s.mu.Unlock()
			return n, nil
		case s.err != nil:
			err := s.err
			s.mu.Unlock()
			return 0, err
		}
		s.mu.Unlock()

		var r response
		err := s.st.RecvMsg(&r) // without the lock, so that Close can cancel it

		s.mu.Lock()
		if s.closed {
			r.raw.Free()
			s.mu.Unlock()
			return 0, errBodyClosed
		}
		if s.err = s.accept(r, err); s.err != nil {
			s.release()
		}
		s.mu.Unlock()
	}
}

// take copies unread data into p and returns how much. s.mu is held.
func (s *stream) take(p []byte) int {
	if len(s.pending) > 0 {
		n := copy(p, s.pending)
		s.pending = s.pending[n:]
		return n
	}
	n := min(len(p), s.left)
	copyFrom(p[:n], s.raw, s.off)
	s.off += n
	s.left -= n
	if s.left == 0 {
		s.raw.Free()
		s.raw = nil
	}
	return n
}

// accept takes in the outcome of a receive: r, or err. It returns nil when
// there may be more to read, io.EOF at the end of a complete body, or the
// error that ends the body. s.mu is held.
func (s *stream) accept(r response, err error) error {
	size := s.md.GetSize()
	switch {
	case errors.Is(err, io.EOF):
		if s.got != size {
			return fmt.Errorf("%w: body is %d bytes; metadata says %d (%w)", ErrBadStream, s.got, size, io.ErrUnexpectedEOF)
		}
		return io.EOF
	case err != nil:
		if ctxErr := s.ctx.Err(); ctxErr != nil {
			return fmt.Errorf("coordd: body after %d of %d bytes: %w", s.got, size, ctxErr)
		}
		return fmt.Errorf("coordd: body cut after %d of %d bytes (%w): %w", s.got, size, io.ErrUnexpectedEOF, err)
	}
	var data []byte
	if r.raw != nil {
		off, n, ok := chunkData(r.raw)
		if ok {
			if int64(n) > size-s.got {
				r.raw.Free()
				return badStream(fmt.Sprintf("body exceeds the %d bytes metadata says", size))
			}
			s.got += int64(n)
			if n == 0 {
				r.raw.Free()
				return nil
			}
			s.raw, s.off, s.left = r.raw, off, n
			return nil
		}
		m := new(coorddv1.GetOrFetchResponse)
		uerr := proto.Unmarshal(r.raw.Materialize(), m)
		r.raw.Free()
		if uerr != nil {
			return badStream(fmt.Sprintf("undecodable message: %v", uerr))
		}
		r.msg = m
	}
	switch ev := r.msg.GetEvent().(type) {
	case *coorddv1.GetOrFetchResponse_Progress:
		return badStream("progress after metadata")
	case *coorddv1.GetOrFetchResponse_Metadata:
		return badStream("second metadata")
	case *coorddv1.GetOrFetchResponse_Chunk:
		data = ev.Chunk.GetData()
	}
	if int64(len(data)) > size-s.got {
		return badStream(fmt.Sprintf("body exceeds the %d bytes metadata says", size))
	}
	s.got += int64(len(data))
	s.pending = data
	return nil
}

// release frees what s holds and ends the stream. s.mu is held.
func (s *stream) release() {
	s.raw.Free()
	s.raw, s.left, s.pending = nil, 0, nil
	s.cancel()
}

// Close cancels the stream if it is still open; coordd stops sending.
// Reads after Close fail. It always returns nil.
func (s *stream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.release()
	}
	return nil
}
