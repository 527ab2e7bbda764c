// Command fakecoordd serves the client conformance corpus's fake coordd
// (package clientconformance) on loopback, for runners that are not Go:
// the TypeScript client's tests start it. It prints one JSON line,
// {"addr": "127.0.0.1:PORT", "control": "http://127.0.0.1:PORT/record"},
// then serves until its standard input ends (its parent went away) or it
// is sent SIGINT or SIGTERM.
//
//	go run ./internal/testing/clientconformance/fakecoordd --corpus testdata/client-conformance
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/coordd/coordd/internal/testing/clientconformance"
)

func main() {
	dir := flag.String("corpus", "testdata/client-conformance", "the corpus directory")
	flag.Parse()
	if err := run(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "fakecoordd:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	corpus, err := clientconformance.Load(dir)
	if err != nil {
		return err
	}
	srv, err := clientconformance.Start(corpus)
	if err != nil {
		return err
	}
	defer srv.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	if err := json.NewEncoder(os.Stdout).Encode(map[string]string{"addr": srv.Addr(), "control": srv.ControlURL()}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
