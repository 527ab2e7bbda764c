package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordd "github.com/coordd/coordd/clients/go"
)

// Limits on tool input, checked before any request.
const (
	maxPathBytes  = 512
	maxQueryBytes = 200
	searchResults = 10 // results listed by mdn_search
)

// getter fetches a document through coordd; *coordd.Client is one.
type getter interface {
	Get(ctx context.Context, url string, opts ...coordd.CallOption) (*coordd.Document, error)
}

// mdn serves the MDN tools. Every request to MDN goes through coordd.
type mdn struct {
	docs   getter
	base   *url.URL // MDN's base URL: scheme, host, optional path prefix
	coordd string   // coordd's address, for error messages
	log    *slog.Logger
}

// docInput is the input of mdn_doc.
type docInput struct {
	Path string `json:"path" jsonschema:"the page's path on MDN, e.g. /en-US/docs/Web/JavaScript/Reference/Global_Objects/Array/map"`
}

// searchInput is the input of mdn_search.
type searchInput struct {
	Query string `json:"query" jsonschema:"what to search for, e.g. array map"`
}

// newServer returns the MCP server with the mdn_doc and mdn_search tools.
func newServer(m *mdn, version string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "mdn-mcp", Title: "MDN Web Docs", Version: version}, &mcp.ServerOptions{
		Instructions: "Read MDN Web Docs pages. Use mdn_search to find a page's path, then mdn_doc to read it.",
		Logger:       m.log,
	})
	s.AddReceivingMiddleware(toolsListByVersion)
	openWorld := true
	ro := &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: &openWorld}
	mcp.AddTool(s, &mcp.Tool{
		Name:        "mdn_doc",
		Title:       "Read an MDN page",
		Description: "Returns an MDN Web Docs page as markdown: title, summary, and every section (syntax, parameters, examples, specifications). Takes the page's path, e.g. /en-US/docs/Web/API/Fetch_API.",
		Annotations: ro,
	}, m.doc)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "mdn_search",
		Title:       "Search MDN",
		Description: fmt.Sprintf("Searches MDN Web Docs and returns the top %d pages with their paths (for mdn_doc) and summaries.", searchResults),
		Annotations: ro,
	}, m.search)
	return s
}

// doc is the mdn_doc tool. Its errors become tool errors (IsError).
func (m *mdn) doc(ctx context.Context, _ *mcp.CallToolRequest, in docInput) (*mcp.CallToolResult, any, error) {
	u, err := docURL(m.base, in.Path)
	if err != nil {
		return nil, nil, err
	}
	var page mdnPage
	if err := m.fetchJSON(ctx, u, "page "+strings.TrimSpace(in.Path), "mdn_doc", &page); err != nil {
		return toolFailure(err)
	}
	if page.Doc.Title == "" {
		return nil, nil, fmt.Errorf("unexpected answer from MDN for page %s: no doc.title in its index.json", in.Path)
	}
	return text(page.markdown(m.base)), nil, nil
}

// search is the mdn_search tool.
func (m *mdn) search(ctx context.Context, _ *mcp.CallToolRequest, in searchInput) (*mcp.CallToolResult, any, error) {
	q := collapse(in.Query)
	switch {
	case q == "":
		return nil, nil, errors.New("query is empty")
	case len(q) > maxQueryBytes:
		return nil, nil, fmt.Errorf("query is %d bytes; the limit is %d", len(q), maxQueryBytes)
	case hasControl(q):
		return nil, nil, errors.New("query contains control characters")
	}
	u := *m.base
	u.Path, u.RawPath = strings.TrimSuffix(m.base.Path, "/")+"/api/v1/search", ""
	u.RawQuery = url.Values{"q": {q}}.Encode()
	var res searchResponse
	what := fmt.Sprintf("search %q", q)
	if err := m.fetchJSON(ctx, &u, what, "mdn_search", &res); err != nil {
		return toolFailure(err)
	}
	if res.Documents == nil { // absent or null; [] is no results
		return nil, nil, fmt.Errorf("unexpected answer from MDN for %s: no documents in it", what)
	}
	return text(res.markdown(q, m.base)), nil, nil
}

// fetchJSON gets u through coordd and decodes its JSON body into v. what
// names the document in error messages, tool the tool to call again.
func (m *mdn) fetchJSON(ctx context.Context, u *url.URL, what, tool string, v any) error {
	doc, err := m.docs.Get(ctx, u.String())
	if err != nil {
		m.log.Warn("fetch through coordd failed", "url", u.String(), "err", err)
		return m.explain(what, tool, err)
	}
	switch code := int(doc.Metadata.GetStatusCode()); {
	case code == http.StatusNotFound || code == http.StatusGone:
		return fmt.Errorf("%s not found on MDN (HTTP %d); use mdn_search to find the right path", what, code)
	case code < 200 || code > 299:
		return fmt.Errorf("MDN answered HTTP %d for %s", code, what)
	}
	if err := json.Unmarshal(doc.Body, v); err != nil {
		return fmt.Errorf("unexpected answer from MDN for %s: %v", what, err)
	}
	return nil
}

// explain turns a coordd client error into a message for the assistant,
// in the TypeScript server's words too (clients/ts/src/mcp/mdn.ts): what
// coordd said is quoted as "(coordd: MESSAGE)". With a RetryInfo detail it
// says when to call tool again, and is a *retryError.
func (m *mdn) explain(what, tool string, err error) error {
	switch {
	case errors.Is(err, coordd.ErrCircuitOpen):
		return fmt.Errorf("cannot get %s: coordd at %s is unreachable and calls fail fast until it is back; try again in a few seconds (%v)", what, m.coordd, err)
	case errors.Is(err, coordd.ErrUnreachable):
		return fmt.Errorf("cannot get %s: coordd at %s is unreachable (%v)", what, m.coordd, err)
	}
	st := grpcStatus(err)
	said := "(coordd: " + st.Message() + ")"
	switch st.Code() {
	case codes.Unavailable, codes.ResourceExhausted:
		why := "MDN is unavailable and coordd has no copy"
		if st.Code() == codes.ResourceExhausted {
			why = "MDN's rate limit is reached and coordd has no copy"
		}
		if after := retryAfterSeconds(st); after > 0 {
			return &retryError{msg: fmt.Sprintf("cannot get %s: %s. %s %s", what, why, retryAdvice(tool, after), said), after: after}
		}
		return fmt.Errorf("cannot get %s: %s %s", what, why, said)
	case codes.DeadlineExceeded:
		return fmt.Errorf("cannot get %s: timed out %s", what, said)
	case codes.PermissionDenied:
		return fmt.Errorf("cannot get %s: coordd at %s does not serve %s to this client: it is not one of its upstreams (start coordd with --upstream mdn=%s, or give this server the --mdn-base coordd serves), or the token's tenant is not granted it %s", what, m.coordd, m.base, m.base, said)
	case codes.Unauthenticated:
		return fmt.Errorf("cannot get %s: coordd at %s requires a valid token: set $COORDD_TOKEN or --coordd-token %s", what, m.coordd, said)
	}
	return fmt.Errorf("cannot get %s through coordd at %s %s", what, m.coordd, said)
}

// grpcStatus returns the status coordd sent, even wrapped in err, its
// message without the wrapping (status.Convert would give err.Error()).
func grpcStatus(err error) *status.Status {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus()
	}
	return status.New(codes.Unknown, err.Error())
}

// retryAfterSeconds is the wait st's RetryInfo asks for, in whole seconds
// rounded up, at least 1; 0 without one.
func retryAfterSeconds(st *status.Status) int {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return max(1, int(math.Ceil(ri.GetRetryDelay().AsDuration().Seconds())))
		}
	}
	return 0
}

// retryAdvice tells an assistant when to call tool again.
func retryAdvice(tool string, seconds int) string {
	unit := "seconds"
	if seconds == 1 {
		unit = "second"
	}
	return fmt.Sprintf("Wait %d %s, then call %s again; calling it sooner fails the same way.", seconds, unit, tool)
}

// retryError is a tool failure that says when to try again: its result
// carries retryAfterSeconds in its structured content, so that an agent
// backs off instead of hammering.
type retryError struct {
	msg   string
	after int // seconds
}

func (e *retryError) Error() string { return e.msg }

// toolFailure returns err as the tool's error result.
func toolFailure(err error) (*mcp.CallToolResult, any, error) {
	var re *retryError
	if !errors.As(err, &re) {
		return nil, nil, err
	}
	return &mcp.CallToolResult{
		IsError:           true,
		Content:           []mcp.Content{&mcp.TextContent{Text: re.msg}},
		StructuredContent: map[string]any{"retryAfterSeconds": re.after},
	}, nil, nil
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// docURL checks that p is a page path on MDN and returns the URL of the
// page's index.json under base. A trailing "/" or "/index.json" is
// accepted.
func docURL(base *url.URL, p string) (*url.URL, error) {
	p = strings.TrimSpace(p)
	switch {
	case p == "":
		return nil, errors.New("path is empty; give a page path such as /en-US/docs/Web/HTTP")
	case len(p) > maxPathBytes:
		return nil, fmt.Errorf("path is %d bytes; the limit is %d", len(p), maxPathBytes)
	case strings.Contains(p, "://") || strings.HasPrefix(p, "//"):
		return nil, fmt.Errorf("path %q is a URL; give only its path, such as /en-US/docs/Web/HTTP", p)
	case !strings.HasPrefix(p, "/"):
		return nil, fmt.Errorf("path %q must start with /, as in /en-US/docs/Web/HTTP", p)
	case strings.ContainsAny(p, "?#\\") || hasControl(p):
		return nil, fmt.Errorf("path %q must not contain ?, #, \\ or control characters", p)
	}
	dec, err := url.PathUnescape(p)
	if err != nil {
		return nil, fmt.Errorf("path %q is not a valid path: bad percent-encoding", p)
	}
	if strings.ContainsAny(dec, "?#\\") || hasControl(dec) || strings.HasPrefix(dec, "//") {
		return nil, fmt.Errorf("path %q must not contain ?, #, \\ or control characters, even escaped", p)
	}
	dec = strings.TrimSuffix(strings.TrimSuffix(dec, "/"), "/index.json")
	for _, seg := range strings.Split(dec, "/") {
		if name, _, _ := strings.Cut(seg, ";"); name == ".." || name == "." {
			return nil, fmt.Errorf("path %q must not contain . or .. segments", p)
		}
	}
	// coordd refuses these too (INVALID_ARGUMENT); say so here, plainly.
	if up := strings.ToUpper(p); strings.Contains(up, "%2F") || strings.Contains(up, "%2E") || strings.Contains(up, "%25") {
		return nil, fmt.Errorf("path %q must not contain an escaped /, . or %%", p)
	}
	if dec == "" {
		return nil, fmt.Errorf("path %q names no page", p)
	}
	u := *base
	u.Path = strings.TrimSuffix(base.Path, "/") + dec + "/index.json"
	u.RawPath, u.RawQuery, u.Fragment = "", "", ""
	return &u, nil
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return true
		}
	}
	return false
}

// mdnPage is the part of a page's index.json that mdn_doc renders.
type mdnPage struct {
	Doc struct {
		Title   string    `json:"title"`
		Summary string    `json:"summary"`
		MDNURL  string    `json:"mdn_url"`
		Body    []section `json:"body"`
	} `json:"doc"`
}

// section is one entry of doc.body: prose (HTML), browser_compatibility,
// specifications, and others rendered like prose if they have content.
type section struct {
	Type  string `json:"type"`
	Value struct {
		ID             string `json:"id"`
		Title          string `json:"title"`
		IsH3           bool   `json:"isH3"`
		Content        string `json:"content"`
		Query          string `json:"query"`
		Specifications []struct {
			URL   string `json:"bcdSpecificationURL"`
			Title string `json:"title"`
		} `json:"specifications"`
	} `json:"value"`
}

// markdown renders the page: title, summary, source URL, then sections.
func (p *mdnPage) markdown(base *url.URL) string {
	d := p.Doc
	r := renderer{base: base}
	page := r.link(d.MDNURL)
	blocks := []string{"# " + collapse(d.Title)}
	if s := collapse(d.Summary); s != "" && !p.introSays(s) {
		blocks = append(blocks, s)
	}
	if page != "" {
		blocks = append(blocks, "Source: "+page)
	}
	for _, s := range p.Doc.Body {
		v := s.Value
		if t := collapse(v.Title); t != "" {
			level := "## "
			if v.IsH3 {
				level = "### "
			}
			blocks = append(blocks, level+t)
		}
		switch s.Type {
		case "browser_compatibility":
			line := "See the compatibility table on MDN"
			if page != "" {
				line += ": " + page + "#" + v.ID
			}
			if v.Query != "" {
				line += " (browser-compat-data: `" + v.Query + "`)"
			}
			blocks = append(blocks, line)
		case "specifications":
			var specs []string
			for _, sp := range v.Specifications {
				if u := r.link(sp.URL); u != "" {
					specs = append(specs, fmt.Sprintf("- [%s](%s)", collapse(sp.Title), u))
				}
			}
			if len(specs) == 0 {
				specs = []string{"No specification listed."}
			}
			blocks = append(blocks, strings.Join(specs, "\n"))
		default:
			if md := htmlToMarkdown(v.Content, base); md != "" {
				blocks = append(blocks, md)
			}
		}
	}
	return strings.Join(blocks, "\n\n") + "\n"
}

// introSays reports whether the page's untitled opening section starts
// with summary, as it usually does: MDN derives the summary from it.
func (p *mdnPage) introSays(summary string) bool {
	if len(p.Doc.Body) == 0 {
		return false
	}
	s := p.Doc.Body[0]
	return s.Type == "prose" && s.Value.Title == "" && strings.HasPrefix(htmlText(s.Value.Content), summary)
}

// searchResponse is the part of MDN's search API answer mdn_search uses.
type searchResponse struct {
	Documents []struct {
		MDNURL  string `json:"mdn_url"`
		Title   string `json:"title"`
		Summary string `json:"summary"`
	} `json:"documents"`
	Metadata struct {
		Total struct {
			Value int `json:"value"`
		} `json:"total"`
	} `json:"metadata"`
}

// markdown lists the top results with their paths.
func (s *searchResponse) markdown(q string, base *url.URL) string {
	docs := s.Documents
	if len(docs) == 0 {
		return fmt.Sprintf("No MDN pages found for %q.\n", q)
	}
	docs = docs[:min(len(docs), searchResults)]
	total := max(s.Metadata.Total.Value, len(s.Documents))
	var b strings.Builder
	fmt.Fprintf(&b, "Top %d of %d MDN results for %q; read one with mdn_doc and its path.\n", len(docs), total, q)
	for i, d := range docs {
		fmt.Fprintf(&b, "\n%d. %s\n   path: %s\n", i+1, collapse(d.Title), pagePath(d.MDNURL, base))
		if sum := collapse(d.Summary); sum != "" {
			fmt.Fprintf(&b, "   %s\n", sum)
		}
	}
	return b.String()
}

// pagePath returns the path of an mdn_url, which MDN gives as a path but
// might give as an absolute URL.
func pagePath(mdnURL string, base *url.URL) string {
	u, err := url.Parse(mdnURL)
	if err != nil || u.Path == "" {
		return mdnURL
	}
	return strings.TrimPrefix(u.Path, strings.TrimSuffix(base.Path, "/"))
}
