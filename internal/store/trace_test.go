package store

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestEventTraceMixedVersions: the traceparent is an optional field of the
// JSON header. An instance that predates it (its Event had no Trace)
// decodes a new event whole, inline document included, and a new instance
// decodes an old event with no trace.
func TestEventTraceMixedVersions(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	// The Event header as it was before Trace existed.
	type oldEvent struct {
		Type   string `json:"t"`
		Key    string `json:"k"`
		Token  string `json:"o,omitempty"`
		Result string `json:"r,omitempty"`
		Drop   bool   `json:"x,omitempty"`
		Kind   string `json:"e,omitempty"`
		Msg    string `json:"m,omitempty"`
		Wait   int64  `json:"w,omitempty"`
	}
	payload := string(Event{Type: EventDone, Key: "id", Token: "tok", Result: "r", Trace: tp, Doc: []byte("doc\nbody")}.encode())
	head, doc, _ := strings.Cut(payload, "\n")
	var old oldEvent
	if err := json.Unmarshal([]byte(head), &old); err != nil || old.Type != EventDone || old.Key != "id" || old.Token != "tok" || doc != "doc\nbody" {
		t.Errorf("an old instance read %+v, doc %q, err %v; want the done event and its document", old, doc, err)
	}
	ev, ok := decodeEvent(payload)
	if !ok || ev.Trace != tp || string(ev.Doc) != "doc\nbody" {
		t.Errorf("decoded %+v; want the traceparent and the document", ev)
	}
	oldPayload, _ := json.Marshal(oldEvent{Type: EventDone, Key: "id", Token: "tok"})
	ev, ok = decodeEvent(string(oldPayload))
	if !ok || ev.Trace != "" || ev.Token != "tok" {
		t.Errorf("decoded an old event as %+v; want it without a trace", ev)
	}
	if untraced := string(Event{Type: EventDone, Key: "id"}.encode()); strings.Contains(untraced, `"tp"`) {
		t.Errorf("an untraced event %q carries tp; want no field", untraced)
	}
}
