package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// The cold path's first answer is also measured with the burst's callers
// in a child process (coordbench --callers ADDR...), as an MCP server's
// would be: callers in coordbench's own process share its scheduler and
// network poller with the servers they measure, so a caller's connection
// is read only once the server's work in flight has drained, and a
// server's Redis reply is seen only once the callers' work has. The child
// is started once per target and kept; each burst is one line of JSON
// each way on its stdin and stdout. Times cross the process boundary as
// wall-clock Unix nanoseconds.

// callersFlag is the child's first argument.
const callersFlag = "--callers"

// remoteBurst is one burst the child runs.
type remoteBurst struct {
	URL     string `json:"url"`
	Callers int    `json:"callers"`
	Size    int    `json:"size"`
	K       int    `json:"k"` // caller i calls addrs[i%K]
}

// remoteResult is what the child measured: its release, and each
// caller's metadata and last byte, or error.
type remoteResult struct {
	Released int64        `json:"released"`
	Calls    []remoteCall `json:"calls"`
}

type remoteCall struct {
	Meta int64  `json:"meta"`
	Done int64  `json:"done"`
	Err  string `json:"err,omitempty"`
}

// callerProc is a running child.
type callerProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *json.Decoder
	enc *json.Encoder
}

// startCallers starts a child calling addrs, once its connections are up.
func startCallers(addrs []string) (*callerProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, append([]string{callersFlag}, addrs...)...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &callerProc{cmd: cmd, in: in, out: json.NewDecoder(bufio.NewReader(out)), enc: json.NewEncoder(in)}
	var ready struct{ Ready bool }
	if err := p.out.Decode(&ready); err != nil || !ready.Ready {
		p.close()
		return nil, fmt.Errorf("callers process: not ready: %v", err)
	}
	return p, nil
}

// burst has the child run b and returns its release and its callers'
// results.
func (p *callerProc) burst(b remoteBurst) (time.Time, []callResult, error) {
	if err := p.enc.Encode(b); err != nil {
		return time.Time{}, nil, err
	}
	var r remoteResult
	if err := p.out.Decode(&r); err != nil {
		return time.Time{}, nil, fmt.Errorf("callers process: %w", err)
	}
	at := func(ns int64) time.Time {
		if ns == 0 {
			return time.Time{}
		}
		return time.Unix(0, ns)
	}
	res := make([]callResult, len(r.Calls))
	for i, c := range r.Calls {
		res[i] = callResult{meta: at(c.Meta), done: at(c.Done)}
		if c.Err != "" {
			res[i].err = errors.New(c.Err)
		}
	}
	return at(r.Released), res, nil
}

func (p *callerProc) close() {
	_ = p.in.Close() // the child exits at the end of its input
	_ = p.cmd.Wait()
}

// callersMain is the child: it dials addrs, says it is ready, then runs
// each burst read from stdin and writes its result to stdout.
func callersMain(addrs []string) error {
	ctx := context.Background()
	var stubs []coorddv1.CoordinatorServiceClient
	for _, a := range addrs {
		cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer cc.Close()
		cc.Connect()
		for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
			if s == connectivity.TransientFailure || s == connectivity.Shutdown || !cc.WaitForStateChange(ctx, s) {
				return fmt.Errorf("dial %s: %v", a, s)
			}
		}
		stubs = append(stubs, coorddv1.NewCoordinatorServiceClient(cc))
	}
	enc, dec := json.NewEncoder(os.Stdout), json.NewDecoder(bufio.NewReader(os.Stdin))
	if err := enc.Encode(struct{ Ready bool }{true}); err != nil {
		return err
	}
	for {
		var b remoteBurst
		if err := dec.Decode(&b); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if b.K < 1 || b.K > len(stubs) {
			return fmt.Errorf("burst over %d of %d addresses", b.K, len(stubs))
		}
		if err := enc.Encode(runRemoteBurst(ctx, stubs[:b.K], b)); err != nil {
			return err
		}
	}
}

// runRemoteBurst releases b's callers at once and waits for them all.
func runRemoteBurst(ctx context.Context, stubs []coorddv1.CoordinatorServiceClient, b remoteBurst) remoteResult {
	ctx, cancel := context.WithTimeout(ctx, 2*joinTimeout)
	defer cancel()
	released, results := callAtOnce(b.Callers, func(i int) callResult {
		return call(ctx, stubs[i%len(stubs)], b.URL, b.Size, func() {})
	})
	r := remoteResult{Released: released.UnixNano()}
	for _, c := range results {
		rc := remoteCall{}
		if c.err != nil {
			rc.Err = c.err.Error()
		} else {
			rc.Meta, rc.Done = c.meta.UnixNano(), c.done.UnixNano()
		}
		r.Calls = append(r.Calls, rc)
	}
	return r
}
