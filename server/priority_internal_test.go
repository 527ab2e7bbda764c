package server

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// The translation of a call's options into the engine's GetOptions, at the
// seam where the server hands them to coordinator.Get: the engine does not
// show a call's priority, so this is where Background is asserted.

func TestGetOptions(t *testing.T) {
	tests := []struct {
		name           string
		req            *coorddv1.GetOrFetchRequest
		wantBackground bool
		wantNoStale    bool
		wantMaxAge     time.Duration
		wantCode       codes.Code
	}{
		{name: "unspecified is interactive", req: &coorddv1.GetOrFetchRequest{}},
		{name: "interactive", req: &coorddv1.GetOrFetchRequest{Priority: coorddv1.Priority_PRIORITY_INTERACTIVE}},
		{name: "background", req: &coorddv1.GetOrFetchRequest{Priority: coorddv1.Priority_PRIORITY_BACKGROUND}, wantBackground: true},
		{name: "background with the other options", req: &coorddv1.GetOrFetchRequest{
			Priority: coorddv1.Priority_PRIORITY_BACKGROUND, NoStale: true, MaxAge: durationpb.New(time.Minute),
		}, wantBackground: true, wantNoStale: true, wantMaxAge: time.Minute},
		{name: "unknown priority 3", req: &coorddv1.GetOrFetchRequest{Priority: 3}, wantCode: codes.InvalidArgument},
		{name: "negative priority", req: &coorddv1.GetOrFetchRequest{Priority: -1}, wantCode: codes.InvalidArgument},
		{name: "negative max_age", req: &coorddv1.GetOrFetchRequest{MaxAge: durationpb.New(-time.Second)}, wantCode: codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opt, err := getOptions(tc.req)
			if got := status.Code(err); got != tc.wantCode {
				t.Fatalf("code = %v (%v); want %v", got, err, tc.wantCode)
			}
			if err != nil {
				return
			}
			if opt.Background != tc.wantBackground || opt.NoStale != tc.wantNoStale || opt.MaxAge != tc.wantMaxAge {
				t.Errorf("GetOptions{Background: %v, NoStale: %v, MaxAge: %v}; want {%v, %v, %v}",
					opt.Background, opt.NoStale, opt.MaxAge, tc.wantBackground, tc.wantNoStale, tc.wantMaxAge)
			}
		})
	}
}

func TestHTTPGetOptionsPriority(t *testing.T) {
	tests := []struct {
		name           string
		param          string // "": none
		header         []string
		wantBackground bool
		wantErr        bool
	}{
		{name: "none is interactive"},
		{name: "parameter background", param: "background", wantBackground: true},
		{name: "parameter interactive", param: "interactive"},
		{name: "header background", header: []string{"background"}, wantBackground: true},
		{name: "header in another case", header: []string{" Background "}, wantBackground: true},
		{name: "header interactive", header: []string{"interactive"}},
		{name: "both agree", param: "background", header: []string{"background"}, wantBackground: true},
		{name: "both disagree", param: "background", header: []string{"interactive"}, wantErr: true},
		{name: "unknown parameter value", param: "urgent", wantErr: true},
		{name: "unknown header value", header: []string{"low"}, wantErr: true},
		{name: "enum name is not a value", header: []string{"PRIORITY_BACKGROUND"}, wantErr: true},
		{name: "two header fields", header: []string{"background", "background"}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := url.Values{}
			if tc.param != "" {
				q.Set("priority", tc.param)
			}
			h := http.Header{}
			for _, v := range tc.header {
				h.Add(HTTPPriorityHeader, v)
			}
			opt, _, err := httpGetOptions(q, h)
			if tc.wantErr {
				if status.Code(err) != codes.InvalidArgument {
					t.Fatalf("err = %v; want INVALID_ARGUMENT", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if opt.Background != tc.wantBackground {
				t.Errorf("Background = %v; want %v", opt.Background, tc.wantBackground)
			}
		})
	}
}
