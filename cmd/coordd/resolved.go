package main

import (
	"github.com/coordd/coordd/gateway"
	"io"
	"net/url"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/coordd/coordd/server"
)

// resolved returns fc as coordd runs it: the coordinator's part with its
// defaults filled in (coordinator.Config.Resolved), and those of the
// fields only coordd has. fc was read from the file, the environment and
// the flags, and checked; it is left as it is.
func (fc fileConfig) resolved() (fileConfig, error) {
	cfg, err := fc.Config.Resolved()
	if err != nil {
		return fc, err
	}
	r := fc
	r.Config = cfg
	r.LogLevel = strings.ToLower(orDefault(fc.LogLevel, "info"))
	r.LogFormat = strings.ToLower(orDefault(fc.LogFormat, "text"))
	if r.MaxConcurrentCalls == 0 {
		r.MaxConcurrentCalls = server.DefaultMaxConcurrentCalls
	}
	if r.Reflection == nil {
		on := true
		r.Reflection = &on
	}
	r.MCPServers = gateway.Resolved(fc.MCPServers)
	r.Tenants = slices.Clone(fc.Tenants)
	for i := range r.Tenants {
		if r.Tenants[i].Weight == nil {
			w := defaultWeight
			r.Tenants[i].Weight = &w
		}
	}
	r.Tracing.Protocol = orDefault(r.Tracing.Protocol, "grpc")
	if r.Tracing.SampleRatio == nil {
		all := 1.0
		r.Tracing.SampleRatio = &all
	}
	return r, nil
}

// redacted is what printRedacted shows in place of a secret.
const redacted = "<redacted>"

// printRedacted writes v as a YAML document with every secret shown as
// <redacted>: the value of any key that names one (tokens, password,
// secret…), and the password of any URL (redis://user:<redacted>@host).
// The names of the variables and files that hold secrets (*_env, *_file)
// stay visible: they are what an operator checks. It goes by keys rather
// than by fields so that a credential field added later is redacted too.
func printRedacted(w io.Writer, v any) error {
	var root yaml.Node
	if err := root.Encode(v); err != nil {
		return err
	}
	redactNode(&root)
	doc := &yaml.Node{
		Kind: yaml.DocumentNode,
		HeadComment: "coordd --check-config: the configuration resolved from the file, the environment and the flags,\n" +
			"defaults filled in; secrets shown as " + redacted + ".",
		Content: []*yaml.Node{&root},
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return err
	}
	return enc.Close()
}

// secretWords mark a key whose value is a secret.
var secretWords = []string{"token", "password", "passwd", "secret", "credential", "authorization", "api_key", "api-key", "apikey", "private_key", "cookie"}

// namesSecret reports whether key names where a secret is read from (an
// environment variable, a file) rather than holding one.
func namesSecret(key string) bool {
	return strings.HasSuffix(key, "_env") || strings.HasSuffix(key, "_file")
}

func isSecretKey(key string) bool {
	key = strings.ToLower(key)
	if namesSecret(key) {
		return false
	}
	for _, w := range secretWords {
		if strings.Contains(key, w) {
			return true
		}
	}
	return false
}

// redactNode redacts, in n and below, the values of secret keys and the
// passwords of URLs.
func redactNode(n *yaml.Node) {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for _, c := range n.Content {
			redactNode(c)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if isSecretKey(n.Content[i].Value) {
				redactAll(n.Content[i+1])
			} else {
				redactNode(n.Content[i+1])
			}
		}
	case yaml.ScalarNode:
		if n.ShortTag() == "!!str" {
			n.Value = redactURL(n.Value)
		}
	}
}

// redactAll redacts every string in n and below but the names of where
// secrets are read from, and of the header a credential is sent in. Empty
// strings stay, and so do booleans and numbers (caller_credentials:
// false): they hide nothing, and what is printed still reads back.
func redactAll(n *yaml.Node) {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.ShortTag() == "!!str" && n.Value != "" {
			n.Value, n.Style = redacted, 0
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			redactAll(c)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := strings.ToLower(n.Content[i].Value); !namesSecret(k) && k != "header" {
				redactAll(n.Content[i+1])
			}
		}
	}
}

// redactURL returns s with the password of its userinfo, if s is a URL
// with one, as <redacted>; s otherwise.
func redactURL(s string) string {
	i, at := strings.Index(s, "://"), strings.LastIndex(s, "@")
	if i < 0 || at < i {
		return s
	}
	u, err := url.Parse(s)
	if err != nil {
		// Not a URL Go reads, but it may hold one's userinfo: hide it all.
		return s[:i+3] + redacted + s[at:]
	}
	if u.User == nil {
		return s
	}
	if _, ok := u.User.Password(); !ok {
		return s
	}
	user := url.User(u.User.Username()).String()
	u.User = nil
	return u.Scheme + "://" + user + ":" + redacted + "@" + strings.TrimPrefix(u.String(), u.Scheme+"://")
}
