package coordinator

import (
	"fmt"

	"github.com/coordd/coordd/internal/upstream"
	"regexp"
	"slices"
)

// Scope is on whose behalf a Target is resolved: the tenant whose
// namespace the document is cached, locked and announced in, and the
// upstreams that tenant may use. The zero Scope is the default tenant with
// every upstream: coordd without authentication.
//
// Two tenants asking for the same url with the same credential share one
// fetch and one document; with different credentials (see Credentials)
// they never share. A custom key is the tenant's own: another tenant
// neither reads, fills nor invalidates it.
type Scope struct {
	// Tenant names the namespace. "" is the default tenant, whose cache
	// ids are those of a coordd without tenants. Others must match
	// TenantNamePattern.
	Tenant string
	// Upstreams are the names of the upstreams the tenant may use. Nil:
	// all of them. Non-nil and empty: none.
	Upstreams []string
	// Credentials are the tenant's own credentials, by upstream name:
	// its calls to that upstream send it instead of the upstream's. Each
	// must have been loaded (upstream.Credential.Load).
	Credentials map[string]*upstream.Credential
	// Weight is the tenant's share of an upstream's slots while fetches
	// of several tenants wait for them: a tenant of weight 2 gets twice
	// the slots of one of weight 1, and a share nobody uses goes to whoever
	// waits. 0: 1.
	Weight int
}

// TenantNamePattern is the regular expression a non-empty Scope.Tenant
// must match. It has no "/", so that a tenant's prefix cannot be mistaken
// for another's.
const TenantNamePattern = `^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`

var tenantNamePattern = regexp.MustCompile(TenantNamePattern)

// ValidTenantName reports whether name may be a Scope.Tenant other than "".
func ValidTenantName(name string) bool { return tenantNamePattern.MatchString(name) }

// grants reports whether s may use the upstream named name.
func (s Scope) grants(name string) bool {
	return s.Upstreams == nil || slices.Contains(s.Upstreams, name)
}

func (s Scope) validate() error {
	if s.Tenant != "" && !ValidTenantName(s.Tenant) {
		return invalid("tenant %q must match %s", s.Tenant, tenantNamePattern)
	}
	return nil
}

func notGranted(s Scope, upstream string) error {
	return ofKind(fmt.Errorf("%w: upstream %q is not granted to tenant %q", ErrForbidden, upstream, s.Tenant), ErrNotGranted)
}
