package server_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/server"
)

// TestPriority: a call's priority, over gRPC (GetOrFetchRequest.priority)
// and over the HTTP door (the priority parameter or X-Coordd-Priority):
// interactive and background calls get the document, and a priority that
// is none of the known ones is refused before any upstream request.
// (TestGetOptions and TestHTTPGetOptionsPriority check what the engine is
// asked for.)
func TestPriority(t *testing.T) {
	u := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{HTTP: true, Config: coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: u.URL() + "/docs/"}},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := in.Dial(t)
	doc := func(name string) string { return u.URL() + "/docs/" + name }

	t.Run("refused", func(t *testing.T) {
		for _, p := range []coorddv1.Priority{3, 100, -1} {
			_, err := fleettest.Get(ctx, cl, &coorddv1.GetOrFetchRequest{Url: doc("refused"), Priority: p})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "priority") {
				t.Errorf("priority %d: err = %v; want INVALID_ARGUMENT naming priority", p, err)
			}
		}
		for _, tc := range []struct {
			name string
			q    url.Values
			h    http.Header
		}{
			{"unknown parameter value", url.Values{"priority": {"urgent"}}, nil},
			{"unknown header value", nil, http.Header{server.HTTPPriorityHeader: {"urgent"}}},
			{"parameter and header disagree", url.Values{"priority": {"background"}}, http.Header{server.HTTPPriorityHeader: {"interactive"}}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				q := url.Values{"url": {doc("refused")}}
				for k, v := range tc.q {
					q[k] = v
				}
				a := httpDo(t, ctx, in, http.MethodGet, server.HTTPDocumentsPath, q, tc.h, nil)
				eb := checkHTTPError(t, a, http.StatusBadRequest)
				if !strings.Contains(eb.Error.Message, "priority") && !strings.Contains(eb.Error.Message, server.HTTPPriorityHeader) {
					t.Errorf("message %q names neither the priority parameter nor %s", eb.Error.Message, server.HTTPPriorityHeader)
				}
			})
		}
		if n := u.Total(); n != 0 {
			t.Errorf("upstream requests = %d; want 0 (refused before any I/O)", n)
		}
	})

	t.Run("served", func(t *testing.T) {
		for _, p := range []coorddv1.Priority{coorddv1.Priority_PRIORITY_UNSPECIFIED, coorddv1.Priority_PRIORITY_INTERACTIVE, coorddv1.Priority_PRIORITY_BACKGROUND} {
			d, err := fleettest.Get(ctx, cl, &coorddv1.GetOrFetchRequest{Url: doc("grpc-" + p.String()), Priority: p})
			if err != nil || d.GetMeta().GetStatusCode() != http.StatusOK {
				t.Errorf("%v: %v, status %d; want the document", p, err, d.GetMeta().GetStatusCode())
			}
		}
		for _, tc := range []struct {
			name string
			q    url.Values
			h    http.Header
		}{
			{"parameter background", url.Values{"priority": {"background"}}, nil},
			{"header background", nil, http.Header{server.HTTPPriorityHeader: {"background"}}},
			{"header interactive", nil, http.Header{server.HTTPPriorityHeader: {"interactive"}}},
		} {
			q := url.Values{"url": {doc("http-" + strings.ReplaceAll(tc.name, " ", "-"))}}
			for k, v := range tc.q {
				q[k] = v
			}
			if a := httpDo(t, ctx, in, http.MethodGet, server.HTTPDocumentsPath, q, tc.h, nil); a.status != http.StatusOK {
				t.Errorf("%s: status %d (%s); want 200", tc.name, a.status, a.body)
			}
		}
	})
}
