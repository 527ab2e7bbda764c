package coordinator

import (
	"time"

	"github.com/coordd/coordd/internal/document"
	"github.com/coordd/coordd/internal/observe"
)

// Document is one cached upstream answer (see document.Document).
type Document = document.Document

// Role is the part a call plays in the fetch of its key.
type Role int

// Roles.
const (
	RoleLeader   Role = iota + 1 // this instance's flight fetches upstream
	RoleFollower                 // waiting for a flight led elsewhere
	RoleHit                      // served from a cache tier
)

func (r Role) String() string {
	switch r {
	case RoleLeader:
		return "leader"
	case RoleFollower:
		return "follower"
	case RoleHit:
		return "hit"
	}
	return "unknown"
}

// Stage is what a call is waiting for.
type Stage = observe.Stage

// Stages.
const (
	StageJoined        = observe.StageJoined        // joined this instance's flight
	StageFetching      = observe.StageFetching      // holds the lock, fetching upstream
	StageWaitingLeader = observe.StageWaitingLeader // another instance holds the lock
	StageRateLimited   = observe.StageRateLimited   // waiting for a rate-limit slot
	StageRetrying      = observe.StageRetrying      // a retry is scheduled
	StageBreakerOpen   = observe.StageBreakerOpen   // the upstream's breaker is open
	StageServingStale  = observe.StageServingStale  // a stale copy is served
	StageDegraded      = observe.StageDegraded      // Redis is unavailable
)

// Progress is an event telling a caller what is happening to its call.
type Progress struct {
	Role    Role
	Stage   Stage
	Detail  string
	Attempt int           // upstream attempt number, for StageRetrying
	Wait    time.Duration // expected wait, when known
}

// Source is the tier a Result came from.
type Source int

// Sources.
const (
	SourceL1       Source = iota + 1 // this instance's memory
	SourceL2                         // Redis, or another instance's flight
	SourceUpstream                   // fetched by this call's flight
)

func (s Source) String() string {
	switch s {
	case SourceL1:
		return "l1"
	case SourceL2:
		return "l2"
	case SourceUpstream:
		return "upstream"
	}
	return "unknown"
}

// Result is what Get returns: a shared, immutable Document and where it
// came from.
type Result struct {
	Doc    *Document
	Source Source
	Stale  bool // Doc is past its fresh lifetime
}
