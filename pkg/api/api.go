package api

import (
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"fiberd.io/fiberd/pkg/core"
)

// Limits of request bodies, enforced before a body is read whole.
const (
	// MaxRequestBody caps every request body. A Clone carries a token (at
	// most 8 KiB) and a payload (at most MaxPayload bytes, base64).
	MaxRequestBody = 32 << 10
	// MaxPayload is the largest Clone payload, in bytes before base64.
	MaxPayload = 4096
	// MaxSession is the longest Clone session name, in bytes.
	MaxSession = 256
)

// ValidSession reports whether s may name a Clone's session: at most
// MaxSession bytes of UTF-8, every character printable (letters, marks,
// numbers, punctuation, symbols and the ASCII space; no control or format
// character, so a session printed in a terminal is only ever text). The
// empty session (none) is valid. The server answers 400 for any other; the
// error says what is wrong without repeating s.
func ValidSession(s string) error {
	if len(s) > MaxSession {
		return fmt.Errorf("session is %d bytes, over the limit of %d", len(s), MaxSession)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("session is not valid UTF-8")
	}
	for i, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("session holds the non-printable character %U at byte %d: use letters, digits, punctuation and spaces", r, i)
		}
	}
	return nil
}

// Clone kinds.
const (
	// KindCreate is a new fiber.
	KindCreate = "create"
	// KindAttach is the running fiber of the named session.
	KindAttach = "attach"
	// KindResume is a parked session brought back: a new fiber (a new
	// fence) whose memory is the parked fiber's as it was.
	KindResume = "resume"
)

// CloneRequest is the body of POST /v1/clone. It names its grant by token
// (Grant) or by UID (GrantUID) of an admitted grant. Naming the home's
// SelfAdmitUID admits the home's own grant in place of any token presented.
type CloneRequest struct {
	// Grant is a compact grant JWT.
	Grant string `json:"grant,omitempty"`
	// GrantUID names an admitted grant.
	GrantUID string `json:"grantUID,omitempty"`
	// Session is a caller-chosen name; a Clone of a running session
	// attaches to its fiber instead of creating a twin, and a Clone of a
	// parked session resumes it (Kind resume; Payload is then ignored:
	// the fiber's memory is as it was). On a listener that does not
	// authenticate, both need the session's ReleaseKey or a Grant token.
	Session string `json:"session,omitempty"`
	// DeadlineMs bounds the clone, in milliseconds. Zero is the server's
	// default.
	DeadlineMs int64 `json:"deadlineMs,omitempty"`
	// Payload is handed to the fiber (FIBERD_PAYLOAD), at most MaxPayload
	// bytes; base64 on the wire.
	Payload []byte `json:"payload,omitempty"`
	// ReleaseKey proves the caller may take over Session on a listener
	// that does not authenticate (plaintext TCP): the CloneResponse's
	// ReleaseKey from the Clone that created the session. There a Clone
	// of a session that has a fiber, running (an attach) or parked (a
	// resume), must name it or carry a token of the grant (Grant), else
	// it is refused with UNAUTHENTICATED (401) and the session's fiber is
	// left alone. It needs Session; a listener that authenticates, or a
	// Clone that creates the session's first fiber, ignores it.
	ReleaseKey string `json:"releaseKey,omitempty"`
}

// CloneResponse is the body of a served Clone.
type CloneResponse struct {
	// FiberID is the fence printed "uid/epoch/seq".
	FiberID string `json:"fiberID"`
	// Endpoint is where the fiber serves: unix:///path or tcp://host:port.
	Endpoint string `json:"endpoint"`
	// Fence is the fiber's incarnation.
	Fence core.Fence `json:"fence"`
	// Kind is create, attach or resume.
	Kind string `json:"kind"`
	// ReleaseKey is the fiber's release key: a secret a caller on a
	// listener that does not authenticate must present to release or park
	// this fiber (FiberRequest.ReleaseKey), and to attach to or resume its
	// session (CloneRequest.ReleaseKey). A fiber with a session has its
	// session's key: the key answered when the session's first fiber was
	// created, the same for every attach and kept across parks and
	// resumes; it dies with the session (released, exited, its image
	// deleted), and a session created again gets a new one. A fiber
	// without a session has a key of its own, which dies with it.
	ReleaseKey string `json:"releaseKey"`
}

// FiberRequest is the body of POST /v1/release and POST /v1/park. The
// release of a parked session's fiber id deletes its image.
//
// On a listener that authenticates its callers (the unix socket, TLS with a
// client certificate) FiberID is enough. On one that does not (plaintext
// TCP) the caller must also prove it may end the fiber: ReleaseKey, the key
// the fiber's Clone answered, or Grant, a token of the fiber's grant.
type FiberRequest struct {
	// FiberID is the fiber's id, "uid/epoch/seq".
	FiberID string `json:"fiberID"`
	// ReleaseKey is the fiber's CloneResponse.ReleaseKey (for a fiber with
	// a session, its session's key).
	ReleaseKey string `json:"releaseKey,omitempty"`
	// Grant is a compact token of the fiber's grant (verified, its UID
	// that of the fiber).
	Grant string `json:"grant,omitempty"`
}

// ParkResponse is the body of a served POST /v1/park: the fiber ended and
// its session is parked, its memory in an image on the home's disk. A
// Clone naming the session (and the grant) resumes it (Kind resume);
// POST /v1/release of FiberID deletes it.
type ParkResponse struct {
	// FiberID is the parked fiber's id: it names the parked session until
	// it is resumed or deleted.
	FiberID string `json:"fiberID"`
	// Session is the session parked.
	Session string `json:"session"`
	// ImageBytes is the size of the image on disk. It holds every page the
	// fiber mapped, those it shared with its template's zygote too.
	ImageBytes int64 `json:"imageBytes"`
	// OwnBytes is the memory the fiber shared with no one when parked: what
	// it cost beyond its zygote.
	OwnBytes int64 `json:"ownBytes"`
}

// Error is the body of every refusal. For a miss, Code is SHED or
// DEFERRED_FALLBACK and Issuer names the control plane; otherwise Code is
// one of the other error codes below.
type Error struct {
	// Code is SHED, DEFERRED_FALLBACK, INVALID, UNAUTHENTICATED,
	// FORBIDDEN, NOT_FOUND, TIER_GAP, BUSY, INSUFFICIENT_STORAGE or
	// INTERNAL.
	Code string `json:"code"`
	// Message says what went wrong and what to do.
	Message string `json:"message"`
	// Issuer is the control plane that can grant more capacity (misses).
	Issuer string `json:"issuer,omitempty"`
	// RetryAfterSeconds repeats the Retry-After header of a SHED.
	RetryAfterSeconds int `json:"retryAfterSeconds,omitempty"`
}

// Error codes besides the miss codes of core.MissCode.
const (
	CodeInvalid         = "INVALID"
	CodeUnauthenticated = "UNAUTHENTICATED"
	// CodeForbidden (403) is a request a listener that does not
	// authenticate refuses as a browser's: a Host that is not the
	// listener's, or a cross-site Origin or Sec-Fetch-Site.
	CodeForbidden = "FORBIDDEN"
	CodeNotFound  = "NOT_FOUND"
	CodeTierGap   = "TIER_GAP"
	CodeInternal  = "INTERNAL"
	// CodeBusy (409) is a park refused while the fiber cannot be parked
	// as it is (a connection to its unix listener is open, another park
	// or Clone of its session is under way); it keeps running. Try again
	// once it is idle.
	CodeBusy = "BUSY"
	// CodeInsufficientStorage (507) is a park refused for room: the
	// grant's parked images are at their bound in count or bytes, the
	// fiber is larger than the room left, or the disk is full. The fiber
	// keeps running.
	CodeInsufficientStorage = "INSUFFICIENT_STORAGE"
)

// Status is the body of GET /v1/status and each line of GET /v1/watch.
type Status struct {
	// Home is the home's name.
	Home string `json:"home"`
	// Epoch is the agent's epoch.
	Epoch uint64 `json:"epoch"`
	// Lane is the control plane's health.
	Lane Lane `json:"lane"`
	// Ready is whether any grant's template is warm.
	Ready bool `json:"ready"`
	// Scope is the home's scope.
	Scope []core.ScopeClaim `json:"scope,omitempty"`
	// Grants are the admitted grants, by UID.
	Grants []GrantStatus `json:"grants"`
	// Redacted is set when the caller is not authenticated: each grant
	// then shows its counts only, without Fibers, ParkedSessions or
	// LatestFence, and its Exits without their FiberID (no fiber id,
	// endpoint or session of anyone's fiber).
	Redacted bool `json:"redacted,omitempty"`
	// Checkpoint says whether this home can park fibers (the CHECKPOINT
	// tier) and, when not, what is missing.
	Checkpoint Checkpoint `json:"checkpoint"`
	// Isolation is what each tier of the agent isolates on this host:
	// WARM, then BASIC; a tier the agent does not serve is left out.
	Isolation []TierIsolation `json:"isolation,omitempty"`
	// MinIsolation is the least isolation the agent serves a grant with
	// (fiberd -min-isolation): "grant" or "fiber"; a grant that would get
	// less is refused with TIER_GAP. Empty for "none", any.
	MinIsolation string `json:"minIsolation,omitempty"`
	// Limits says which kernel limits the agent sets on this host; nil from
	// an agent that does not say.
	Limits *Limits `json:"limits,omitempty"`
}

// Limits is what the agent's cgroups enforce on this host, in a Status. A
// limit whose controller the agent's cgroup root does not offer is not
// set, and Missing names the controller.
type Limits struct {
	// Cgroups is false when the agent carves no cgroups (none given, or
	// none it could delegate): no limit below is set then.
	Cgroups bool `json:"cgroups"`
	// FiberPidsMax is each fiber leaf's pids.max; 0 when none is set.
	FiberPidsMax int64 `json:"fiberPidsMax,omitempty"`
	// GrantCPUWeight is each grant cgroup's cpu.weight; 0 when none is
	// set.
	GrantCPUWeight int `json:"grantCpuWeight,omitempty"`
	// WBudgetByCgroup is set when grants' W budgets are their fibers'
	// memory.max; otherwise the agent measures them.
	WBudgetByCgroup bool `json:"wBudgetByCgroup,omitempty"`
	// Missing names the controllers the agent uses that its cgroup root
	// does not offer: "memory", "pids", "cpu".
	Missing []string `json:"missing,omitempty"`
}

// Checkpoint is the CHECKPOINT tier's state in a Status.
type Checkpoint struct {
	// Available is set when fibers of zygote templates can be parked.
	Available bool `json:"available"`
	// Reason says what is missing when Available is false (no CRIU
	// configured or found, a CRIU too old, a missing capability).
	Reason string `json:"reason,omitempty"`
	// Isolated says, when Available, why the fibers of a grant isolated
	// at "fiber" (the WARM tier's level) cannot be parked here (a CRIU
	// without fiberd's patches, a missing capability); empty when they
	// can, or when the tier does not isolate. Grants at "grant" are never
	// parkable: their fibers share the zygote's PID namespace.
	Isolated string `json:"isolated,omitempty"`
}

// TierIsolation is what one tier (one backend) of the agent isolates, in a
// Status.
type TierIsolation struct {
	Tier core.Tier `json:"tier"`
	// Level is the most isolation a grant served at Tier gets: "none"
	// (fibers run as fiberd, in its namespaces), "grant" (a user and
	// namespaces per grant) or "fiber" (also a PID namespace and /tmp per
	// fiber).
	Level string `json:"level"`
	// NetworkNone says a template asking for "network": "none" can be
	// served at Tier.
	NetworkNone bool `json:"networkNone"`
	// EndpointsApart says a fiber of one isolated grant cannot connect to
	// another grant's fibers' TCP endpoints (the endpoint guard, which
	// needs nftables).
	EndpointsApart bool `json:"endpointsApart"`
	// Missing says what keeps Level below what fiberd was asked for
	// (-isolation), or NetworkNone or EndpointsApart false, and how to
	// fix it; empty when nothing is missing.
	Missing string `json:"missing,omitempty"`
}

// Lane is the lane's health in a Status.
type Lane struct {
	Healthy  bool      `json:"healthy"`
	LastSync time.Time `json:"lastSync"`
}

// GrantStatus is one admitted grant in a Status.
type GrantStatus struct {
	UID         string        `json:"uid"`
	Template    string        `json:"template"`
	Warm        bool          `json:"warm"`
	Running     int           `json:"running"`
	Max         int           `json:"max"`
	LeaseExpiry time.Time     `json:"leaseExpiry"`
	LatestFence *core.Fence   `json:"latestFence,omitempty"`
	Tier        core.Tier     `json:"tier"`
	Fibers      []FiberStatus `json:"fibers,omitempty"`
	// Error says why the grant's template is not warm (it failed to
	// start, its devices or cgroup could not be had); empty when warm or
	// still warming for the first time.
	Error string `json:"error,omitempty"`
	// WBudget is the memory, in bytes, each fiber of the grant may dirty;
	// 0 is no budget.
	WBudget int64 `json:"wBudget,omitempty"`
	// WBudgetBy is how the budget is enforced: "cgroup" (memory.max on
	// each fiber's leaf) or "measured" (fiberd measures each fiber's
	// private memory and ends one over it); empty without a budget.
	WBudgetBy string `json:"wBudgetBy,omitempty"`
	// OverBudget counts the grant's fibers ended for going over WBudget.
	OverBudget int `json:"overBudget,omitempty"`
	// Isolation is the isolation the grant's fibers get ("none", "grant"
	// or "fiber", see TierIsolation): its tier's, or less when its
	// template says "isolation": "shared". Empty while it is not warm.
	Isolation string `json:"isolation,omitempty"`
	// Exits are the last fibers of the grant that ended on their own or
	// for their budget (not those released), oldest first, at most
	// MaxExits.
	Exits []FiberExit `json:"exits,omitempty"`
	// Parked counts the grant's parked sessions, and ParkedBytes sums
	// their images' sizes.
	Parked      int   `json:"parked,omitempty"`
	ParkedBytes int64 `json:"parkedBytes,omitempty"`
	// ParkedSessions are the grant's parked sessions, by session name.
	ParkedSessions []ParkedSession `json:"parkedSessions,omitempty"`
	// Spares are the grant's spare fibers (its fibers.warm); nil when the
	// grant asks for none or is not warm.
	Spares *SpareStatus `json:"spares,omitempty"`
}

// SpareStatus is a grant's spare fibers in a GrantStatus: fibers forked
// ahead from its zygote and waiting, so a Clone hands one over instead of
// forking. They are not running fibers: Running and Fibers do not count
// them.
type SpareStatus struct {
	// Warm is the grant's fibers.warm, the spares it asks for.
	Warm int `json:"warm"`
	// HandOver is set when the grant's template hands spares over (its
	// zygote said "READY spares"); without it every Clone forks and the
	// grant has no spares.
	HandOver bool `json:"handOver"`
	// Wanted is how many spares the grant should have now: min(Warm, Max -
	// Running), 0 without HandOver or after Failed.
	Wanted int `json:"wanted"`
	// Ready is how many spares are forked and waiting now.
	Ready int `json:"ready"`
	// Taken counts the Clones served by a spare since the zygote started.
	Taken uint64 `json:"taken"`
	// Bytes is the memory the waiting spares hold of their own: the sum
	// of their Private_Dirty (pages not shared with the zygote).
	Bytes int64 `json:"bytes"`
	// Failed is set when spares kept failing to start or dying untaken:
	// the grant gets no more until one is taken or the grant is renewed
	// with another fibers.warm or max; Clones fork meanwhile.
	Failed bool `json:"failed,omitempty"`
}

// ParkedSession is one parked session in a GrantStatus.
type ParkedSession struct {
	// Session is the session's name: a Clone naming it resumes it.
	Session string `json:"session"`
	// FiberID is the fiber it was parked as; releasing it deletes the
	// image.
	FiberID string `json:"fiberID"`
	// ImageBytes and OwnBytes are as in ParkResponse.
	ImageBytes int64 `json:"imageBytes"`
	OwnBytes   int64 `json:"ownBytes"`
	// ParkedAt is when it was parked.
	ParkedAt time.Time `json:"parkedAt"`
	// By is what parked it: "api" (POST /v1/park) or "pressure" (fiberd,
	// for the grant's memory pressure).
	By string `json:"by"`
}

// MaxExits is how many recent fiber exits a GrantStatus lists.
const MaxExits = 8

// FiberExit is a fiber that ended, in a GrantStatus.
type FiberExit struct {
	FiberID string `json:"fiberID"`
	// Reason says how: "exit:0", "signal:SIGSEGV", "template died", or
	// "over wBudget: ..." for a fiber ended for its budget.
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// FiberStatus is one running fiber in a GrantStatus.
type FiberStatus struct {
	FiberID  string `json:"fiberID"`
	Session  string `json:"session,omitempty"`
	Endpoint string `json:"endpoint"`
	// Isolation is the isolation the fiber got: its grant's, or "grant"
	// under a grant of "fiber" when its template's zygote did not give it
	// namespaces of its own (a zygote without the SDK's support).
	Isolation string `json:"isolation,omitempty"`
}
