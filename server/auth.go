package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"maps"
	"slices"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/upstream"
)

// MinTokenBytes is the shortest bearer token NewAuth accepts: 16 bytes,
// so that a token cannot be guessed in any number of calls a server sees.
const MinTokenBytes = 16

// Tenant is one caller identity, recognised by its bearer tokens.
type Tenant struct {
	// Name is the tenant's namespace: its documents, locks and
	// invalidations are its own (coordinator.Scope.Tenant). It must match
	// coordinator.TenantNamePattern.
	Name string
	// Tokens authenticate the tenant: a call carrying any one of them as
	// "authorization: Bearer <token>" is the tenant's. Several allow a
	// rotation without downtime. At least one; each at least
	// MinTokenBytes long and not shared with another tenant.
	Tokens []string
	// Upstreams are the names of the upstreams the tenant may use. Nil:
	// all of them.
	Upstreams []string
	// Admin allows the tenant to call Invalidate (on its own namespace).
	Admin bool
	// Credentials are the tenant's own credentials, by upstream name,
	// loaded (upstream.Credential.Load): its calls to that upstream send
	// them instead of the upstream's (coordinator.Scope.Credentials).
	Credentials map[string]*upstream.Credential
	// Weight is the tenant's share of an upstream's slots while fetches of
	// several tenants wait for them (coordinator.Scope.Weight), 1..1000.
	// 0: 1.
	Weight int
}

// Auth authenticates calls to CoordinatorService by bearer token and gives
// each the Scope of its tenant. Health and reflection stay open. It is
// immutable and safe for concurrent use.
type Auth struct {
	tokens []authToken
}

type authToken struct {
	sum [sha256.Size]byte // of the token; the token itself is not kept
	p   *principal
}

// principal is who a call is made by.
type principal struct {
	scope coordinator.Scope
	admin bool
}

// open is the principal of every call when no Auth is configured: the
// default tenant, every upstream, allowed to Invalidate.
var open = &principal{admin: true}

// MaxWeight is the largest Tenant.Weight.
const MaxWeight = 1000

// NewAuth returns an Auth for tenants. It fails, naming the tenant by its
// index and never quoting a token, on a bad name, a duplicate name, a
// tenant without tokens, a short token, a token shared by two tenants or a
// weight out of range.
// Upstream names are not checked here: coordd's config does that against
// its upstreams.
func NewAuth(tenants []Tenant) (*Auth, error) {
	if len(tenants) == 0 {
		return nil, fmt.Errorf("server: auth: no tenants")
	}
	a := &Auth{}
	names := make(map[string]bool)
	owner := make(map[[sha256.Size]byte]string)
	for i, t := range tenants {
		field := fmt.Sprintf("tenants[%d]", i)
		if !coordinator.ValidTenantName(t.Name) {
			return nil, fmt.Errorf("%s.name: %q must match %s", field, t.Name, coordinator.TenantNamePattern)
		}
		if names[t.Name] {
			return nil, fmt.Errorf("%s.name: duplicate name %q", field, t.Name)
		}
		names[t.Name] = true
		field = fmt.Sprintf("tenants[%d] (%s)", i, t.Name)
		if len(t.Tokens) == 0 {
			return nil, fmt.Errorf("%s.tokens: none given", field)
		}
		if t.Weight < 0 || t.Weight > MaxWeight {
			return nil, fmt.Errorf("%s.weight: %d must be between 1 and %d", field, t.Weight, MaxWeight)
		}
		p := &principal{scope: coordinator.Scope{Tenant: t.Name, Upstreams: slices.Clone(t.Upstreams), Credentials: maps.Clone(t.Credentials), Weight: t.Weight}, admin: t.Admin}
		for j, tok := range t.Tokens {
			if len(tok) < MinTokenBytes {
				return nil, fmt.Errorf("%s.tokens[%d]: %d bytes; want at least %d", field, j, len(tok), MinTokenBytes)
			}
			sum := sha256.Sum256([]byte(tok))
			if other, ok := owner[sum]; ok && other != t.Name {
				return nil, fmt.Errorf("%s.tokens[%d]: also a token of tenant %q", field, j, other)
			}
			owner[sum] = t.Name
			a.tokens = append(a.tokens, authToken{sum: sum, p: p})
		}
	}
	return a, nil
}

// authenticate returns the principal token belongs to. It compares
// SHA-256 digests, so that every comparison takes the same time whatever
// the token's length, and goes through every token whether or not one
// matched, so that the time taken tells nothing of which.
func (a *Auth) authenticate(token string) (*principal, bool) {
	sum := sha256.Sum256([]byte(token))
	var found *principal
	for i := range a.tokens {
		if subtle.ConstantTimeCompare(sum[:], a.tokens[i].sum[:]) == 1 {
			found = a.tokens[i].p
		}
	}
	return found, found != nil
}

type principalKey struct{}

// authFunc is the AuthFunc of go-grpc-middleware's auth interceptor: the
// call's bearer token to its principal, or UNAUTHENTICATED.
func (a *Auth) authFunc(ctx context.Context) (context.Context, error) {
	token, err := auth.AuthFromMD(ctx, "bearer")
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, errNoToken)
	}
	p, ok := a.authenticate(token)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "the bearer token is not valid")
	}
	return context.WithValue(ctx, principalKey{}, p), nil
}

// authOptions are the interceptors that authenticate calls to
// CoordinatorService, and only those: health and reflection stay open. None
// without an Auth.
func (s *Server) authOptions() []grpc.ServerOption {
	if s.auth == nil {
		return nil
	}
	coorddOnly := selector.MatchFunc(func(_ context.Context, m interceptors.CallMeta) bool {
		return m.Service == coorddv1.CoordinatorService_ServiceDesc.ServiceName
	})
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(selector.UnaryServerInterceptor(auth.UnaryServerInterceptor(s.auth.authFunc), coorddOnly)),
		grpc.ChainStreamInterceptor(selector.StreamServerInterceptor(auth.StreamServerInterceptor(s.auth.authFunc), coorddOnly)),
	}
}

// principal returns who makes the call whose context is ctx. With an Auth,
// a context the interceptor did not authenticate is refused: the Server
// fails closed if it is served without its interceptors.
func (s *Server) principal(ctx context.Context) (*principal, error) {
	if s.auth == nil {
		return s.openPrincipal(), nil
	}
	if p, ok := ctx.Value(principalKey{}).(*principal); ok {
		return p, nil
	}
	return nil, status.Error(codes.Unauthenticated, errNoToken)
}

// The refusals of a call without a token say how one is sent.
const (
	errNoToken     = "a bearer token is required: send the metadata `authorization: Bearer TOKEN` (grpcurl: -H 'authorization: Bearer TOKEN')"
	errNoHTTPToken = "a bearer token is required: send the header `Authorization: Bearer TOKEN`"
)

// Option configures New.
type Option func(*Server)

// WithAuth requires a tenant's bearer token on every call to
// CoordinatorService, and scopes the call to that tenant. Default (nil):
// no authentication; every caller is the default tenant, with every
// upstream and the right to Invalidate.
func WithAuth(a *Auth) Option { return func(s *Server) { s.auth = a } }

// WithOpenUpstreams limits the callers of a Server without Auth to the
// upstreams named: the others belong to another door (the MCP gateway's).
// Default: every upstream.
func WithOpenUpstreams(names []string) Option {
	return func(s *Server) {
		s.open = &principal{admin: true, scope: coordinator.Scope{Upstreams: slices.Clone(names)}}
	}
}

func (s *Server) openPrincipal() *principal {
	if s.open != nil {
		return s.open
	}
	return open
}

// Tenant returns the name of the tenant token is of.
func (a *Auth) Tenant(token string) (string, bool) {
	p, ok := a.authenticate(token)
	if !ok {
		return "", false
	}
	return p.scope.Tenant, true
}

// WithReflection says whether NewGRPC registers server reflection.
// Default: true.
func WithReflection(on bool) Option { return func(s *Server) { s.noReflection = !on } }
