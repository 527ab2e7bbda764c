// Command fakeapid serves a fakeapi.API for tests written in other
// languages: it prints the API's base url on the first line of stdout and
// serves until stdin closes or it is killed.
//
//	fakeapid -tokens alice=tok-a,bob=tok-b [-delay 100ms] [-limit 5000]
//	         [-window 2s [-limit-status 429]] [-max-concurrent 4]
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/coordd/coordd/internal/testing/fakeapi"
)

func main() {
	tokens := flag.String("tokens", "", "login=token pairs, separated by commas")
	delay := flag.Duration("delay", 0, "hold every answer this long")
	limit := flag.Int("limit", 0, "requests per login per hour, or per -window (default 5000)")
	window := flag.Duration("window", 0, "GitHub's primary rate limit, scaled: -limit requests per login per this window (default: per hour, never reset)")
	limitStatus := flag.Int("limit-status", 0, "the status past the primary limit: 403 (default, GitHub's) or 429")
	maxConcurrent := flag.Int("max-concurrent", 0, "GitHub's secondary rate limit: past this many concurrent requests of a login, 403 with Retry-After (default: none)")
	flag.Parse()
	opts := fakeapi.Options{Tokens: map[string]string{}, Delay: *delay, Limit: *limit,
		Window: *window, LimitStatus: *limitStatus, MaxConcurrent: *maxConcurrent}
	for _, pair := range strings.Split(*tokens, ",") {
		if login, tok, ok := strings.Cut(pair, "="); ok {
			opts.Tokens[tok] = login
		}
	}
	a := fakeapi.Start(opts)
	defer a.Close()
	fmt.Println(a.URL())
	_, _ = io.Copy(io.Discard, os.Stdin)
}
