package coordd

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// maxPrealloc bounds the body buffer allocated up front from the size the
// metadata announces, so that a size no body follows costs at most this
// much; a larger body grows as its chunks arrive.
const maxPrealloc = 16 << 20

// Document is a document reassembled from a GetOrFetch stream.
type Document struct {
	// Body is the document's body: every chunk, concatenated.
	Body []byte
	// Metadata describes the document: the upstream's status code (a 404
	// is a document too), content type, ETag, the tier it came from, its
	// age and whether it is stale.
	Metadata *coorddv1.Metadata
	// Progress holds the progress events of the attempt that produced the
	// document, in the order they arrived.
	Progress []*coorddv1.Progress
}

// Get returns the document at url, an absolute http(s) URL inside one of
// coordd's configured upstreams. An upstream answer that is not 2xx, such
// as a 404, is a Document with that status code, not an error.
//
// Errors are gRPC status errors (INVALID_ARGUMENT for a malformed url,
// UNAUTHENTICATED without a valid token (WithToken) where coordd requires
// one, PERMISSION_DENIED for one outside every upstream or of an upstream
// the token's tenant is not granted, UNAVAILABLE when the
// upstream fails and no stale copy exists, DEADLINE_EXCEEDED), possibly
// wrapped in ErrUnreachable or ErrCircuitOpen; or they wrap ErrBadStream,
// or ErrBodyTooLarge for a body above WithMaxBodyBytes.
// Get retries per the Client's
// RetryPolicy; an attempt that fails after part of the document arrived is
// discarded whole and the next attempt starts over.
func (c *Client) Get(ctx context.Context, url string, opts ...CallOption) (*Document, error) {
	co := newCallOptions(opts)
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	req := &coorddv1.GetOrFetchRequest{Url: url, Key: co.key, NoStale: co.noStale, Priority: co.priority}
	if co.maxAge > 0 {
		req.MaxAge = durationpb.New(co.maxAge)
	}
	var doc *Document
	err := c.do(ctx, func(ctx context.Context) error {
		d, err := c.getOnce(ctx, req, co.progress)
		doc = d
		return err
	})
	if err != nil {
		return nil, wrapCall("GetOrFetch", url, err)
	}
	return doc, nil
}

// getOnce makes one GetOrFetch attempt and reassembles its stream. The
// stream is cancelled on return, so an early return leaks nothing.
//
// The body is allocated once, from the size the metadata announces (up to
// maxPrealloc), and each chunk's data is copied straight into it from
// gRPC's receive buffers (see recvCodec). A stream that sends more than
// the announced size fails as soon as it does, and one announcing more than
// the Client's maxBody fails on its metadata.
func (c *Client) getOnce(ctx context.Context, req *coorddv1.GetOrFetchRequest, progress func(*coorddv1.Progress)) (*Document, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.api.GetOrFetch(ctx, req, recvCodecOption)
	if err != nil {
		return nil, err
	}
	return receive(st.RecvMsg, progress, c.maxBody)
}

// receive reassembles a document from the messages recvMsg stores, through
// recvCodec, into a *response, until it returns io.EOF. A metadata size
// above maxBody, if positive, fails with ErrBodyTooLarge.
func receive(recvMsg func(any) error, progress func(*coorddv1.Progress), maxBody int64) (*Document, error) {
	d := &Document{}
	var r response
	for {
		r = response{}
		err := recvMsg(&r)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			r.raw.Free()
			return nil, err
		}
		m := r.msg
		if r.raw != nil {
			if m, err = d.appendChunk(r.raw); err != nil {
				return nil, err
			}
		}
		switch ev := m.GetEvent().(type) {
		case *coorddv1.GetOrFetchResponse_Progress:
			if d.Metadata != nil {
				return nil, badStream("progress after metadata")
			}
			d.Progress = append(d.Progress, ev.Progress)
			if progress != nil {
				progress(ev.Progress)
			}
		case *coorddv1.GetOrFetchResponse_Metadata:
			if d.Metadata != nil {
				return nil, badStream("second metadata")
			}
			size := ev.Metadata.GetSize()
			if size < 0 {
				return nil, badStream(fmt.Sprintf("metadata says size %d", size))
			}
			if maxBody > 0 && size > maxBody {
				return nil, fmt.Errorf("%w: metadata says %d bytes; the limit is %d (WithMaxBodyBytes)", ErrBodyTooLarge, size, maxBody)
			}
			d.Metadata = ev.Metadata
			d.Body = make([]byte, 0, min(size, maxPrealloc))
		case *coorddv1.GetOrFetchResponse_Chunk:
			if err := d.appendData(ev.Chunk.GetData()); err != nil {
				return nil, err
			}
		}
	}
	switch {
	case d.Metadata == nil:
		return nil, badStream("stream ended without metadata")
	case int64(len(d.Body)) != d.Metadata.GetSize():
		return nil, badStream(fmt.Sprintf("body is %d bytes; metadata says %d", len(d.Body), d.Metadata.GetSize()))
	}
	return d, nil
}

// appendChunk appends the data of raw, a chunk message in wire form, to
// d's body, and frees raw. It returns nil, or, for a message of another
// shape than coordd's chunks, the message decoded as protobuf, for the
// caller to handle instead.
func (d *Document) appendChunk(raw mem.BufferSlice) (*coorddv1.GetOrFetchResponse, error) {
	defer raw.Free()
	off, n, ok := chunkData(raw)
	if !ok {
		m := new(coorddv1.GetOrFetchResponse)
		if err := proto.Unmarshal(raw.Materialize(), m); err != nil {
			return nil, badStream(fmt.Sprintf("undecodable message: %v", err))
		}
		return m, nil
	}
	body, err := d.grow(n)
	if err != nil {
		return nil, err
	}
	copyFrom(body, raw, off)
	return nil, nil
}

// appendData appends data to d's body.
func (d *Document) appendData(data []byte) error {
	body, err := d.grow(len(data))
	if err != nil {
		return err
	}
	copy(body, data)
	return nil
}

// grow extends d's body by n bytes and returns them, for the caller to
// fill. It fails if the metadata has not arrived, or if the body would
// exceed the size it announced.
func (d *Document) grow(n int) ([]byte, error) {
	if d.Metadata == nil {
		return nil, badStream("chunk before metadata")
	}
	have, size := len(d.Body), d.Metadata.GetSize()
	if int64(n) > size-int64(have) {
		return nil, badStream(fmt.Sprintf("body exceeds the %d bytes metadata says", size))
	}
	if have+n > cap(d.Body) {
		// Only a body larger than maxPrealloc gets here: grow by doubling,
		// as append would, but never past the announced size.
		nb := make([]byte, have, min(int64(max(2*cap(d.Body), have+n)), size))
		copy(nb, d.Body)
		d.Body = nb
	}
	d.Body = d.Body[:have+n]
	return d.Body[have:], nil
}

func badStream(detail string) error {
	return fmt.Errorf("%w: %s", ErrBadStream, detail)
}

// Invalidate removes the document at url from coordd's shared cache and
// from the in-memory cache of every instance. WithKey names the document
// by its cache key instead; the other CallOptions do not apply. The
// response tells the key removed and whether the shared cache held it.
func (c *Client) Invalidate(ctx context.Context, url string, opts ...CallOption) (*coorddv1.InvalidateResponse, error) {
	co := newCallOptions(opts)
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	req := &coorddv1.InvalidateRequest{Url: url, Key: co.key}
	var resp *coorddv1.InvalidateResponse
	err := c.do(ctx, func(ctx context.Context) error {
		r, err := c.api.Invalidate(ctx, req)
		resp = r
		return err
	})
	if err != nil {
		return nil, wrapCall("Invalidate", url, err)
	}
	return resp, nil
}

// wrapCall adds the method and url to err, except to ErrUnreachable,
// which is about coordd rather than the url.
func wrapCall(method, url string, err error) error {
	if errors.Is(err, ErrUnreachable) {
		return err
	}
	return fmt.Errorf("coordd: %s %q: %w", method, url, err)
}

// GetMetadata returns d's metadata; nil-safe.
func (d *Document) GetMetadata() *coorddv1.Metadata {
	if d == nil {
		return nil
	}
	return d.Metadata
}
