package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// The usage that --help prints. The TypeScript server's --help
// (clients/ts/src/mcp/server.ts) prints the same words in the same layout
// under its own name: TestUsage compares the two.
const (
	usageHead = `usage: %s [flags]

An MCP server for assistants: its tools mdn_doc (an MDN Web Docs page as
markdown) and mdn_search (MDN's search) read MDN through coordd, so that
many assistants asking for the same page cost MDN one request.

Transports:
  stdio            the default: MCP on stdin and stdout; logs go to stderr
  Streamable HTTP  with --http ADDR: MCP at http://ADDR/mcp, stateless (any
                   replica answers any request), with /healthz, draining on
                   SIGTERM

Flags:
`
	usageTail = `  --help, -h
        print this usage, then exit

Environment:
  COORDD_TOKEN             the default of --coordd-token, out of sight of ps
  MDN_MCP_ALLOWED_ORIGINS  the default of --allowed-origins
  MDN_MCP_TOKEN            with --http: the bearer token MCP clients must send
                           at /mcp; unset, none is asked for
`
	usageIndent = "        " // of a flag's text
	usageWidth  = 80
)

// envDefaults are the flags whose default, when they are not given, is an
// environment variable. They are applied after parsing, so that a flag's
// DefValue, which --help shows, never holds a secret such as a token.
var envDefaults = []struct{ flag, env string }{
	{"allowed-origins", "MDN_MCP_ALLOWED_ORIGINS"},
	{"coordd-token", "COORDD_TOKEN"},
}

// applyEnvDefaults sets each flag of envDefaults that args did not give
// to its environment variable, if that is set.
func applyEnvDefaults(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, d := range envDefaults {
		if v, ok := os.LookupEnv(d.env); ok && !given[d.flag] {
			if err := fs.Set(d.flag, v); err != nil {
				return fmt.Errorf("$%s: %w", d.env, err)
			}
		}
	}
	return nil
}

// writeUsage prints fs's usage: usageHead, each flag (its argument named by
// the backquoted word of its usage, as flag.UnquoteUsage finds it, in
// capitals; its text wrapped, with its default), then usageTail.
func writeUsage(w io.Writer, fs *flag.FlagSet) {
	var b strings.Builder
	fmt.Fprintf(&b, usageHead, fs.Name())
	fs.VisitAll(func(f *flag.Flag) {
		arg, text := flag.UnquoteUsage(f)
		b.WriteString("  --" + f.Name)
		if arg != "" {
			b.WriteString(" " + strings.ToUpper(arg))
		}
		b.WriteString("\n")
		if f.DefValue != "" && f.DefValue != "false" {
			text += " (default " + f.DefValue + ")"
		}
		for _, line := range wrap(text, usageWidth-len(usageIndent)) {
			b.WriteString(usageIndent + line + "\n")
		}
	})
	b.WriteString(usageTail)
	_, _ = io.WriteString(w, b.String())
}

// wrap breaks text into lines of at most width bytes at spaces; a word
// longer than width has a line of its own.
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
