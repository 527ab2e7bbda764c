package main

import (
	"encoding"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// decodeYAML decodes the YAML document src into v (a pointer to a struct)
// as yaml.v3 does with KnownFields, but reports every problem, each
// naming the key path it is at (upstreams[0].retry.max_attempts) and its
// line, never the Go type it was to fill: yaml.v3's own errors read
// "cannot unmarshal !!str `soon` into time.Duration" and "field x not
// found in type main.fileConfig", which a user of the file cannot act on.
// Each scalar is still decoded by yaml.v3 (Node.Decode), so values mean
// what they meant.
func decodeYAML(src []byte, v any) []error {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return []error{err} // a syntax error: "yaml: line 3: …"
	}
	if len(doc.Content) == 0 {
		return nil // empty: every default
	}
	perSecond(doc.Content[0], map[*yaml.Node]bool{})
	d := &yamlDecoder{expanding: map[*yaml.Node]bool{}}
	d.decode(doc.Content[0], reflect.ValueOf(v).Elem(), "")
	return d.errs
}

// perSecond lets a rate be written with its unit: rate_limit: 20/s (and
// degraded_rate_limit) is 20 requests a second, as docs/gateway.md writes
// it; the fields themselves are integers per second.
func perSecond(n *yaml.Node, seen map[*yaml.Node]bool) {
	if seen[n] {
		return
	}
	seen[n] = true
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if (k.Value == "rate_limit" || k.Value == "degraded_rate_limit") && v.Kind == yaml.ScalarNode {
				if num, ok := strings.CutSuffix(v.Value, "/s"); ok && num != "" && strings.Trim(num, "-0123456789") == "" {
					v.Value, v.Tag, v.Style = num, "!!int", 0
				}
			}
		}
	}
	for _, c := range n.Content {
		perSecond(c, seen)
	}
}

func (d *yamlDecoder) fail(n *yaml.Node, path, format string, args ...any) {
	if path == "" {
		path = "."
	}
	d.errs = append(d.errs, &yamlError{line: n.Line, path: path, msg: fmt.Sprintf(format, args...)})
}

// yamlError is one problem of a configuration file, at a key path and a
// line.
type yamlError struct {
	line int
	path string // the key path; "." for the document itself
	msg  string
}

func (e *yamlError) Error() string { return fmt.Sprintf("line %d: %s: %s", e.line, e.path, e.msg) }

type yamlDecoder struct {
	errs      []error
	expanding map[*yaml.Node]bool // aliases being expanded: a cycle is an error, not a hang
}

var (
	unmarshalerType     = reflect.TypeFor[yaml.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	durationType        = reflect.TypeFor[time.Duration]()
)

// decode decodes n into v, which is settable, reporting problems under
// path.
func (d *yamlDecoder) decode(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind == yaml.AliasNode {
		if d.expanding[n] {
			d.fail(n, path, "alias *%s refers to itself", n.Value)
			return
		}
		d.expanding[n] = true
		defer delete(d.expanding, n)
		d.decode(n.Alias, v, path)
		return
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		v.SetZero()
		return
	}
	if pt := reflect.PointerTo(v.Type()); pt.Implements(unmarshalerType) || (n.Kind == yaml.ScalarNode && pt.Implements(textUnmarshalerType)) {
		d.leaf(n, v, path) // a type that decodes itself
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		if !v.IsNil() {
			p.Elem().Set(v.Elem())
		}
		d.decode(n, p.Elem(), path)
		v.Set(p)
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			d.fail(n, path, "want a mapping (key: value lines), not %s", describe(n))
			return
		}
		fields := yamlFields(v.Type())
		d.mapping(n, path, func(key *yaml.Node, val *yaml.Node) {
			p := joinPath(path, key.Value)
			idx, ok := fields[key.Value]
			if !ok {
				msg := "unknown field"
				if hint := closest(key.Value, slices.Sorted(maps.Keys(fields))); hint != "" {
					msg += "; did you mean " + hint + "?"
				}
				d.fail(key, p, "%s", msg)
				return
			}
			d.decode(val, fieldByIndex(v, idx), p)
		})
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			d.fail(n, path, "want a mapping (key: value lines), not %s", describe(n))
			return
		}
		if v.IsNil() {
			v.Set(reflect.MakeMap(v.Type()))
		}
		d.mapping(n, path, func(key *yaml.Node, val *yaml.Node) {
			p := joinPath(path, key.Value)
			k := reflect.New(v.Type().Key()).Elem()
			e := reflect.New(v.Type().Elem()).Elem()
			d.leaf(key, k, p)
			d.decode(val, e, p)
			v.SetMapIndex(k, e)
		})
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(n, path, "want a list (- item lines, or [a, b]), not %s", describe(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, c := range n.Content {
			d.decode(c, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	default:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "want a single value, not %s", describe(n))
			return
		}
		d.leaf(n, v, path)
	}
}

// mapping calls each for each key and value of the mapping n, merge keys
// (<<: *base) first so that the mapping's own keys win, and reports a key
// given twice.
func (d *yamlDecoder) mapping(n *yaml.Node, path string, each func(key, val *yaml.Node)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		if key.ShortTag() != "!!merge" {
			continue
		}
		merged := []*yaml.Node{val}
		if val.Kind == yaml.SequenceNode {
			merged = val.Content
		}
		for _, m := range merged {
			if m.Kind == yaml.AliasNode {
				m = m.Alias
			}
			if m.Kind != yaml.MappingNode {
				d.fail(val, path, "<< wants a mapping or a list of mappings, not %s", describe(m))
				continue
			}
			for j := 0; j+1 < len(m.Content); j += 2 {
				each(m.Content[j], m.Content[j+1])
			}
		}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		if key.ShortTag() == "!!merge" {
			continue
		}
		if key.Kind != yaml.ScalarNode {
			d.fail(key, path, "a key must be a single value, not %s", describe(key))
			continue
		}
		if first, ok := seen[key.Value]; ok {
			d.fail(key, joinPath(path, key.Value), "given twice (first at line %d)", first)
			continue
		}
		seen[key.Value] = key.Line
		each(key, val)
	}
}

// leaf decodes the scalar (or self-decoding value) n into v with yaml.v3,
// and words a failure by what v wants. The value is quoted only for kinds
// that cannot hold a secret: a string that fails to decode is not shown.
func (d *yamlDecoder) leaf(n *yaml.Node, v reflect.Value, path string) {
	p := reflect.New(v.Type())
	if err := n.Decode(p.Interface()); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			// A type's own UnmarshalYAML error: its words, less yaml's prefix.
			d.fail(n, path, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
			return
		}
		switch t := v.Type(); {
		case t == durationType:
			d.fail(n, path, "%q is not a duration (such as 500ms, 10s or 1m30s)", n.Value)
		case t.Kind() == reflect.Bool:
			d.fail(n, path, "%q is not true or false", n.Value)
		case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
			d.fail(n, path, "%q is not a whole number in range", n.Value)
		case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
			d.fail(n, path, "%q is not a number", n.Value)
		default:
			d.fail(n, path, "cannot read %s here", describe(n))
		}
		return
	}
	v.Set(p.Elem())
}

// describe names what n is, in YAML's words.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	return "a single value"
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// yamlFields maps each yaml key of struct type t to its field's index
// path, as yaml.v3 reads the tags: "-" skipped, ",inline" structs merged
// in, an untagged field keyed by its lowercased name.
func yamlFields(t reflect.Type) map[string][]int {
	out := map[string][]int{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		tag := f.Tag.Get("yaml")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if slices.Contains(strings.Split(opts, ","), "inline") {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, idx := range yamlFields(ft) {
					out[k] = append([]int{i}, idx...)
				}
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = []int{i}
	}
	return out
}

// fieldByIndex is v.FieldByIndex, allocating nil inline pointers.
func fieldByIndex(v reflect.Value, idx []int) reflect.Value {
	for i, x := range idx {
		if i > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() {
				v.Set(reflect.New(v.Type().Elem()))
			}
			v = v.Elem()
		}
		v = v.Field(x)
	}
	return v
}
