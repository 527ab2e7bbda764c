package server_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/server"
)

const (
	tokenA  = "team-a-token-0123456789" // team-a: upstream "a" only, admin
	tokenA2 = "team-a-token-rotated-99" // team-a's second token
	tokenB  = "team-b-token-0123456789" // team-b: every upstream, no admin
)

var testTenants = []server.Tenant{
	{Name: "team-a", Tokens: []string{tokenA, tokenA2}, Upstreams: []string{"a"}, Admin: true},
	{Name: "team-b", Tokens: []string{tokenB}},
}

// bearer is per-RPC credentials for a plaintext test connection.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

// rawAuth sends authorization exactly as given.
type rawAuth string

func (r rawAuth) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": string(r)}, nil
}
func (rawAuth) RequireTransportSecurity() bool { return false }

type authEnv struct {
	up        *fakeupstream.Upstream
	instances []*fleettest.Instance
}

// startAuth runs n instances sharing one Redis, with testTenants, over one
// fake upstream split into two: "a" (/a) and "b" (/b).
func startAuth(t *testing.T, n int, opts ...server.Option) *authEnv {
	t.Helper()
	a, err := server.NewAuth(testTenants)
	if err != nil {
		t.Fatal(err)
	}
	env := &authEnv{up: fakeupstream.New(t)}
	rd := redistest.Start(t)
	for range n {
		cfg := coordinator.Config{Upstreams: []coordinator.Upstream{
			{Name: "a", BaseURL: env.up.URL() + "/a"},
			{Name: "b", BaseURL: env.up.URL() + "/b"},
		}}
		countPerCall(&cfg)
		env.instances = append(env.instances, fleettest.Start(t, fleettest.Options{
			RedisURL: rd.URL(), Config: cfg, ServerOptions: append([]server.Option{server.WithAuth(a)}, opts...),
		}))
	}
	return env
}

func (env *authEnv) client(t *testing.T, i int, token string) coorddv1.CoordinatorServiceClient {
	if token == "" {
		return env.instances[i].Dial(t)
	}
	return env.instances[i].Dial(t, grpc.WithPerRPCCredentials(bearer(token)))
}

// TestAuthRefusals: calls without a valid token are UNAUTHENTICATED, and
// calls beyond the tenant's rights PERMISSION_DENIED, every one before any
// upstream request.
func TestAuthRefusals(t *testing.T) {
	env := startAuth(t, 1)
	in := env.instances[0]
	get := func(u string) *coorddv1.GetOrFetchRequest { return &coorddv1.GetOrFetchRequest{Url: env.up.URL() + u} }
	tests := []struct {
		name  string
		creds grpc.DialOption // nil: no token
		call  func(context.Context, coorddv1.CoordinatorServiceClient) error
		want  codes.Code
	}{
		{"no token", nil, getCall(get("/a/x")), codes.Unauthenticated},
		{"wrong token", grpc.WithPerRPCCredentials(bearer("not-a-token-of-anyone")), getCall(get("/a/x")), codes.Unauthenticated},
		{"token of another scheme", grpc.WithPerRPCCredentials(rawAuth("Basic " + tokenA)), getCall(get("/a/x")), codes.Unauthenticated},
		{"token prefix", grpc.WithPerRPCCredentials(bearer(tokenA[:len(tokenA)-1])), getCall(get("/a/x")), codes.Unauthenticated},
		{"empty bearer", grpc.WithPerRPCCredentials(rawAuth("Bearer ")), getCall(get("/a/x")), codes.Unauthenticated},
		{"upstream not granted", grpc.WithPerRPCCredentials(bearer(tokenA)), getCall(get("/b/x")), codes.PermissionDenied},
		{"upstream not granted, second token", grpc.WithPerRPCCredentials(bearer(tokenA2)), getCall(get("/b/x")), codes.PermissionDenied},
		{"invalidate without token", nil, invalidateCall(&coorddv1.InvalidateRequest{Url: env.up.URL() + "/a/x"}), codes.Unauthenticated},
		{"invalidate without admin", grpc.WithPerRPCCredentials(bearer(tokenB)), invalidateCall(&coorddv1.InvalidateRequest{Url: env.up.URL() + "/b/x"}), codes.PermissionDenied},
		{"invalidate of a key without admin", grpc.WithPerRPCCredentials(bearer(tokenB)), invalidateCall(&coorddv1.InvalidateRequest{Key: "k"}), codes.PermissionDenied},
		{"invalidate of an upstream not granted", grpc.WithPerRPCCredentials(bearer(tokenA)), invalidateCall(&coorddv1.InvalidateRequest{Url: env.up.URL() + "/b/x"}), codes.PermissionDenied},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []grpc.DialOption
			if tt.creds != nil {
				opts = append(opts, tt.creds)
			}
			err := tt.call(ctx, in.Dial(t, opts...))
			if got := status.Code(err); got != tt.want {
				t.Errorf("code = %v (%v); want %v", got, err, tt.want)
			}
		})
	}
	// The refusal says how a token is sent.
	if err := getCall(get("/a/x"))(ctx, in.Dial(t)); !strings.Contains(status.Convert(err).Message(), "authorization: Bearer TOKEN") {
		t.Errorf("no token: %v; want the refusal to say how a token is sent", err)
	}
	if got := env.up.Total(); got != 0 {
		t.Errorf("upstream requests = %d; want 0 (refused before any I/O)", got)
	}
	if got := in.Metrics.Fetches(); got != 0 {
		t.Errorf("coordinator upstream requests = %d; want 0", got)
	}
}

func getCall(req *coorddv1.GetOrFetchRequest) func(context.Context, coorddv1.CoordinatorServiceClient) error {
	return func(ctx context.Context, c coorddv1.CoordinatorServiceClient) error {
		_, err := fleettest.Get(ctx, c, req)
		return err
	}
}

func invalidateCall(req *coorddv1.InvalidateRequest) func(context.Context, coorddv1.CoordinatorServiceClient) error {
	return func(ctx context.Context, c coorddv1.CoordinatorServiceClient) error {
		_, err := c.Invalidate(ctx, req)
		return err
	}
}

// TestTenantsSeparate: two tenants fetching the same url under the same
// custom key get separate cache entries, one upstream fetch each, and one
// tenant's Invalidate, seen by every instance, leaves the other's copy
// alone. (A url without a custom key is the upstream's answer, which
// tenants with the same credential share: TestCredentialScopes.)
func TestTenantsSeparate(t *testing.T) {
	const path = "/a/doc"
	for _, key := range []string{"custom-key"} {
		t.Run("key="+key, func(t *testing.T) {
			env := startAuth(t, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			url := env.up.URL() + path
			req := &coorddv1.GetOrFetchRequest{Url: url, Key: key}
			a0, a1 := env.client(t, 0, tokenA), env.client(t, 1, tokenA2)
			b0, b1 := env.client(t, 0, tokenB), env.client(t, 1, tokenB)
			steps := []struct {
				name       string
				c          coorddv1.CoordinatorServiceClient
				wantSource coorddv1.Source
				wantCount  int // upstream requests after the step
			}{
				{"a fetches", a0, coorddv1.Source_SOURCE_UPSTREAM, 1},
				{"b fetches its own", b1, coorddv1.Source_SOURCE_UPSTREAM, 2},
				{"a hits, other instance, other token", a1, coorddv1.Source_SOURCE_L2, 2},
				{"b hits, other instance", b0, coorddv1.Source_SOURCE_L2, 2},
				{"b hits again", b1, coorddv1.Source_SOURCE_L1, 2},
			}
			for _, s := range steps {
				d, err := fleettest.Get(ctx, s.c, req)
				if err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				if got := d.Meta.GetSource(); got != s.wantSource {
					t.Errorf("%s: source = %v; want %v", s.name, got, s.wantSource)
				}
				if got := env.up.Count(path); got != s.wantCount {
					t.Fatalf("%s: upstream requests = %d; want %d", s.name, got, s.wantCount)
				}
			}
			inv := &coorddv1.InvalidateRequest{Url: url, Key: key}
			if key != "" {
				inv = &coorddv1.InvalidateRequest{Key: key} // a key alone: every upstream team-a is granted
			}
			res, err := a0.Invalidate(ctx, inv)
			if err != nil || !res.GetExisted() {
				t.Fatalf("a's Invalidate = %v, %v; want existed", res, err)
			}
			// b's copy survives in every instance's L1 and in L2.
			for i, c := range []coorddv1.CoordinatorServiceClient{b0, b1} {
				d, err := fleettest.Get(ctx, c, req)
				if err != nil || d.Meta.GetSource() == coorddv1.Source_SOURCE_UPSTREAM {
					t.Fatalf("b on instance %d after a's Invalidate: %v, source %v; want its cached copy", i, err, d.GetMeta().GetSource())
				}
			}
			if got := env.up.Count(path); got != 2 {
				t.Fatalf("upstream requests after b's reads = %d; want 2", got)
			}
			// a's copy is gone from both instances: instance 1 drops its L1
			// copy when the invalidation's event reaches it.
			var d *fleettest.Doc
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if d, err = fleettest.Get(ctx, a1, req); err != nil || d.Meta.GetSource() != coorddv1.Source_SOURCE_L1 || time.Now().After(deadline) {
					break
				}
			}
			if err != nil || d.Meta.GetSource() != coorddv1.Source_SOURCE_UPSTREAM {
				t.Fatalf("a after its Invalidate: %v, source %v; want UPSTREAM", err, d.GetMeta().GetSource())
			}
			if got := env.up.Count(path); got != 3 {
				t.Fatalf("upstream requests = %d; want 3", got)
			}
		})
	}
}

// TestAuthHealthAndReflectionOpen: health checks and reflection need no
// token; reflection can be turned off.
func TestAuthHealthAndReflectionOpen(t *testing.T) {
	for _, refl := range []bool{true, false} {
		env := startAuth(t, 1, server.WithReflection(refl))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cc := env.instances[0].Conn(t)
		h, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: coorddv1.CoordinatorService_ServiceDesc.ServiceName})
		if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("reflection %v: health check without token = %v, %v; want SERVING", refl, h, err)
		}
		st, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// io.EOF: the server already ended the stream (Unimplemented, with
		// reflection off); Recv gives its status.
		if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		_, err = st.Recv()
		want := codes.OK
		if !refl {
			want = codes.Unimplemented
		}
		if got := status.Code(err); got != want {
			t.Errorf("reflection %v: list services without token: %v; want %v", refl, err, want)
		}
	}
}

func TestNewAuthRefusesBadTenants(t *testing.T) {
	long := "0123456789abcdef"
	tests := []struct {
		name    string
		tenants []server.Tenant
	}{
		{"none", nil},
		{"bad name", []server.Tenant{{Name: "a/b", Tokens: []string{long}}}},
		{"empty name", []server.Tenant{{Name: "", Tokens: []string{long}}}},
		{"duplicate name", []server.Tenant{{Name: "a", Tokens: []string{long}}, {Name: "a", Tokens: []string{long + "x"}}}},
		{"no tokens", []server.Tenant{{Name: "a"}}},
		{"short token", []server.Tenant{{Name: "a", Tokens: []string{"short"}}}},
		{"shared token", []server.Tenant{{Name: "a", Tokens: []string{long}}, {Name: "b", Tokens: []string{long}}}},
		{"weight too large", []server.Tenant{{Name: "a", Tokens: []string{long}, Weight: server.MaxWeight + 1}}},
		{"negative weight", []server.Tenant{{Name: "a", Tokens: []string{long}, Weight: -1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := server.NewAuth(tt.tenants); err == nil {
				t.Errorf("NewAuth(%+v) = nil error; want one", tt.tenants)
			}
		})
	}
}
