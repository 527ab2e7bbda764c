package secret

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestValueNeverPrints: every way a Value, or a struct holding one in an
// exported or unexported field, is printed, marshalled or logged shows
// Redacted, never the secret.
func TestValueNeverPrints(t *testing.T) {
	const canary = "canary-9f8e7d6c5b4a"
	v := New(canary)
	type holder struct {
		Exported   Value
		unexported Value
		Ptr        *Value
	}
	h := holder{Exported: v, unexported: v, Ptr: &v}
	var out []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d"} {
		out = append(out, fmt.Sprintf(verb, v), fmt.Sprintf(verb, h), fmt.Sprintf(verb, &h))
	}
	out = append(out, fmt.Sprint(v, h), fmt.Sprintln(h), v.String())
	j, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	for _, hd := range []slog.Handler{slog.NewTextHandler(&logs, nil), slog.NewJSONHandler(&logs, nil)} {
		slog.New(hd).Info("m", "v", v, "h", h, "p", &v)
	}
	out = append(out, string(j), string(y), logs.String())
	for _, s := range out {
		if strings.Contains(s, canary) || strings.Contains(s, fmt.Sprintf("%x", canary)) {
			t.Errorf("printed %q", s)
		}
	}
	if !strings.Contains(string(j), "redacted") || !strings.Contains(string(y), Redacted) || !strings.Contains(logs.String(), Redacted) {
		t.Errorf("json %s, yaml %s, logs %s: want %s", j, y, logs.String(), Redacted)
	}
	if v.Reveal() != canary || New("").Reveal() != "" || !New("").IsZero() || v.IsZero() || !v.Equal(New(canary)) {
		t.Errorf("Reveal, IsZero or Equal wrong")
	}
}
