package main

import (
	"fmt"
	"net/url"
	"strings"

	"golang.org/x/net/html"
	"golang.org/x/net/html/atom"
)

// hardBreak stands for a <br> while inline text is collapsed; it becomes a
// newline when the paragraph is finished.
const hardBreak = "\uE000"

// htmlToMarkdown renders the HTML of an MDN prose section as markdown:
// headings, paragraphs, fenced code blocks with their language, inline
// code, emphasis, links made absolute against base, lists, definition
// lists, notes as block quotes and tables as pipe rows. Any other tag is
// dropped and its text kept; scripts, styles, forms and embedded frames are
// dropped whole.
func htmlToMarkdown(src string, base *url.URL) string {
	ctx := &html.Node{Type: html.ElementNode, Data: "div", DataAtom: atom.Div}
	nodes, err := html.ParseFragment(strings.NewReader(src), ctx)
	if err != nil { // only a failing reader makes it fail
		return collapse(src)
	}
	root := &html.Node{Type: html.ElementNode, Data: "div", DataAtom: atom.Div}
	for _, n := range nodes {
		root.AppendChild(n)
	}
	r := renderer{base: base}
	return strings.Join(r.blocks(root), "\n\n")
}

// htmlText returns the text of src with its whitespace collapsed.
func htmlText(src string) string {
	ctx := &html.Node{Type: html.ElementNode, Data: "div", DataAtom: atom.Div}
	nodes, err := html.ParseFragment(strings.NewReader(src), ctx)
	if err != nil {
		return collapse(src)
	}
	var b strings.Builder
	for _, n := range nodes {
		b.WriteString(textContent(n) + " ")
	}
	return collapse(b.String())
}

// renderer turns parsed HTML into markdown blocks.
type renderer struct {
	base *url.URL // links are resolved against it
}

var blockTags = map[atom.Atom]bool{
	atom.Address: true, atom.Article: true, atom.Aside: true, atom.Blockquote: true,
	atom.Details: true, atom.Div: true, atom.Dl: true, atom.Dd: true, atom.Dt: true,
	atom.Fieldset: true, atom.Figcaption: true, atom.Figure: true, atom.Footer: true,
	atom.H1: true, atom.H2: true, atom.H3: true, atom.H4: true, atom.H5: true, atom.H6: true,
	atom.Header: true, atom.Hr: true, atom.Li: true, atom.Main: true, atom.Nav: true,
	atom.Ol: true, atom.P: true, atom.Pre: true, atom.Section: true, atom.Summary: true,
	atom.Table: true, atom.Ul: true,
}

var droppedTags = map[atom.Atom]bool{
	atom.Button: true, atom.Embed: true, atom.Form: true, atom.Iframe: true, atom.Input: true,
	atom.Math: true, atom.Noscript: true, atom.Object: true, atom.Script: true, atom.Select: true,
	atom.Style: true, atom.Svg: true, atom.Template: true, atom.Textarea: true,
}

// isBlock reports whether n starts a block of its own. Custom elements
// (their names have a dash) count as blocks: MDN wraps examples in them.
func isBlock(n *html.Node) bool {
	return n.Type == html.ElementNode && (blockTags[n.DataAtom] || (n.DataAtom == 0 && strings.Contains(n.Data, "-")))
}

func isDropped(n *html.Node) bool {
	return n.Type == html.CommentNode || (n.Type == html.ElementNode && droppedTags[n.DataAtom])
}

// blocks renders the children of n: runs of inline content become
// paragraphs, block elements their own blocks.
func (r *renderer) blocks(n *html.Node) []string {
	var out []string
	var para strings.Builder
	flush := func() {
		if s := finish(para.String()); s != "" {
			out = append(out, s)
		}
		para.Reset()
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		switch {
		case isDropped(c):
		case isBlock(c):
			flush()
			out = append(out, r.block(c)...)
		default:
			r.inline(&para, c)
		}
	}
	flush()
	return out
}

// block renders one block element.
func (r *renderer) block(n *html.Node) []string {
	switch n.DataAtom {
	case atom.H1, atom.H2, atom.H3, atom.H4, atom.H5, atom.H6:
		text := r.inlineText(n)
		if text == "" {
			return nil
		}
		return []string{strings.Repeat("#", int(n.Data[1]-'0')) + " " + strings.ReplaceAll(text, "\n", " ")}
	case atom.Pre:
		code := strings.Trim(textContent(n), "\n")
		if strings.TrimSpace(code) == "" {
			return nil
		}
		return []string{fence(codeLanguage(n), code)}
	case atom.Ul, atom.Ol:
		return nonEmpty(r.list(n, n.DataAtom == atom.Ol))
	case atom.Dl:
		return nonEmpty(r.definitions(n))
	case atom.Table:
		return nonEmpty(r.table(n))
	case atom.Blockquote:
		return nonEmpty(quote(r.blocks(n)))
	case atom.Hr:
		return []string{"---"}
	case atom.Div, atom.Aside, atom.Section:
		switch {
		case hasClass(n, "example-header"): // the language label over a code example
			return nil
		case n.DataAtom == atom.Aside || hasClass(n, "notecard"):
			return nonEmpty(quote(r.blocks(n)))
		}
	}
	return r.blocks(n)
}

// list renders ul and ol items, tight, with nested blocks indented under
// their item.
func (r *renderer) list(n *html.Node, ordered bool) string {
	var items []string
	for li := n.FirstChild; li != nil; li = li.NextSibling {
		if li.Type != html.ElementNode || li.DataAtom != atom.Li {
			continue
		}
		marker := "- "
		if ordered {
			marker = fmt.Sprintf("%d. ", len(items)+1)
		}
		body := strings.Join(r.blocks(li), "\n")
		items = append(items, indent(body, marker, strings.Repeat(" ", len(marker))))
	}
	return strings.Join(items, "\n")
}

// definitions renders a dl as a list of terms, each description indented
// under its term. MDN documents parameters and return values this way.
func (r *renderer) definitions(n *html.Node) string {
	var lines []string
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		if c.Type != html.ElementNode {
			continue
		}
		switch c.DataAtom {
		case atom.Dt:
			if t := r.inlineText(c); t != "" {
				lines = append(lines, indent(t, "- ", "  "))
			}
		case atom.Dd:
			if b := strings.Join(r.blocks(c), "\n"); b != "" {
				lines = append(lines, indent(b, "  ", "  "))
			}
		}
	}
	return strings.Join(lines, "\n")
}

// table renders rows as pipe-separated cells, the first row as the header.
func (r *renderer) table(n *html.Node) string {
	var rows [][]string
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			switch c.DataAtom {
			case atom.Thead, atom.Tbody, atom.Tfoot:
				walk(c)
			case atom.Tr:
				var cells []string
				for td := c.FirstChild; td != nil; td = td.NextSibling {
					if td.DataAtom == atom.Td || td.DataAtom == atom.Th {
						cell := strings.ReplaceAll(r.inlineText(td), "\n", " ")
						cells = append(cells, strings.ReplaceAll(cell, "|", `\|`))
					}
				}
				if len(cells) > 0 {
					rows = append(rows, cells)
				}
			}
		}
	}
	walk(n)
	if len(rows) == 0 {
		return ""
	}
	var b strings.Builder
	for i, row := range rows {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
		if i == 0 {
			b.WriteString("|" + strings.Repeat(" --- |", len(row)) + "\n")
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// inline writes the inline rendering of n to b; whitespace is collapsed
// later, by finish.
func (r *renderer) inline(b *strings.Builder, n *html.Node) {
	switch {
	case n.Type == html.TextNode:
		b.WriteString(n.Data)
		return
	case n.Type != html.ElementNode || isDropped(n):
		return
	}
	switch n.DataAtom {
	case atom.Br:
		b.WriteString(hardBreak)
	case atom.Code, atom.Kbd, atom.Samp, atom.Tt, atom.Var:
		if t := collapse(textContent(n)); t != "" {
			b.WriteString(codeSpan(t))
		}
	case atom.A:
		text := collapse(r.inner(n))
		switch href := r.link(attr(n, "href")); {
		case text == "":
		case href == "":
			b.WriteString(text)
		default:
			fmt.Fprintf(b, "[%s](%s)", text, href)
		}
	case atom.Strong, atom.B:
		emphasize(b, r.inner(n), "**")
	case atom.Em, atom.I:
		emphasize(b, r.inner(n), "*")
	case atom.Img:
		b.WriteString(attr(n, "alt"))
	default:
		if isBlock(n) { // a block inside inline content, as in a table cell
			b.WriteString(" " + r.inner(n) + " ")
			return
		}
		b.WriteString(r.inner(n))
	}
}

// inner returns the inline rendering of n's children, not yet collapsed.
func (r *renderer) inner(n *html.Node) string {
	var b strings.Builder
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		r.inline(&b, c)
	}
	return b.String()
}

// inlineText returns n's content as one finished line of inline markdown.
func (r *renderer) inlineText(n *html.Node) string {
	return finish(r.inner(n))
}

// link returns href made absolute against the base, or "" for an in-page
// anchor or a link that is not http(s).
func (r *renderer) link(href string) string {
	if href == "" || strings.HasPrefix(href, "#") {
		return ""
	}
	u, err := url.Parse(strings.TrimSpace(href))
	if err != nil {
		return ""
	}
	if r.base != nil {
		u = r.base.ResolveReference(u)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return ""
	}
	return strings.NewReplacer("(", "%28", ")", "%29", " ", "%20").Replace(u.String())
}

// emphasize wraps raw in marker, keeping its outer whitespace outside the
// markers, where markdown needs it.
func emphasize(b *strings.Builder, raw, marker string) {
	t := collapse(raw)
	if t == "" {
		b.WriteString(raw)
		return
	}
	if strings.TrimLeft(raw, " \t\r\n") != raw {
		b.WriteString(" ")
	}
	b.WriteString(marker + t + marker)
	if strings.TrimRight(raw, " \t\r\n") != raw {
		b.WriteString(" ")
	}
}

// collapse turns every run of whitespace into one space and trims the ends.
func collapse(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// finish collapses inline text and turns hard breaks into newlines.
func finish(s string) string {
	lines := strings.Split(collapse(s), hardBreak)
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return strings.TrimSpace(strings.Join(lines, "\n"))
}

// textContent returns the text of n and its descendants as it is, for code.
func textContent(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		switch {
		case n.Type == html.TextNode:
			b.WriteString(n.Data)
		case n.DataAtom == atom.Br:
			b.WriteString("\n")
		case isDropped(n):
		default:
			for c := n.FirstChild; c != nil; c = c.NextSibling {
				walk(c)
			}
		}
	}
	walk(n)
	return b.String()
}

// codeLanguage reads the language of a pre from its class ("brush: js"
// on MDN) or from its code child's ("language-js").
func codeLanguage(pre *html.Node) string {
	classes := attr(pre, "class")
	if c := pre.FirstChild; c != nil && c.DataAtom == atom.Code {
		classes += " " + attr(c, "class")
	}
	fields := strings.Fields(classes)
	for i, f := range fields {
		var lang string
		switch {
		case f == "brush:" && i+1 < len(fields):
			lang = fields[i+1]
		case strings.HasPrefix(f, "brush:"):
			lang = strings.TrimPrefix(f, "brush:")
		case strings.HasPrefix(f, "language-"):
			lang = strings.TrimPrefix(f, "language-")
		}
		if lang = strings.ToLower(lang); lang != "" && strings.Trim(lang, "abcdefghijklmnopqrstuvwxyz0123456789+-_") == "" {
			return lang
		}
	}
	return ""
}

// fence wraps code in a fenced block longer than any backtick run in it.
func fence(lang, code string) string {
	f := "```"
	for strings.Contains(code, f) {
		f += "`"
	}
	return f + lang + "\n" + code + "\n" + f
}

// codeSpan wraps t in backticks, doubled when t holds one.
func codeSpan(t string) string {
	if strings.Contains(t, "`") {
		return "`` " + t + " ``"
	}
	return "`" + t + "`"
}

// indent prefixes the first line of s with first and the others with rest;
// empty lines stay empty.
func indent(s, first, rest string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		switch {
		case i == 0:
			lines[i] = first + l
		case l != "":
			lines[i] = rest + l
		}
	}
	return strings.Join(lines, "\n")
}

// quote renders blocks as a block quote.
func quote(blocks []string) string {
	s := strings.Join(blocks, "\n\n")
	if s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight("> "+l, " ")
	}
	return strings.Join(lines, "\n")
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func hasClass(n *html.Node, class string) bool {
	for _, c := range strings.Fields(attr(n, "class")) {
		if c == class {
			return true
		}
	}
	return false
}
