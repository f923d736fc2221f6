package fiberd

import "context"

// ScopeLoser is a home that can lose the scope it runs in, such as a
// Kubernetes Pod that is deleted. The agent registers its epoch bump with
// OnScopeLost before it runs the home; the home calls fn once per reason, on
// a goroutine of its own, with the reason a person reads in a log.
type ScopeLoser interface {
	OnScopeLost(fn func(ctx context.Context, reason string))
}

// EndpointHoster is a home that knows the address fibers are reached at,
// such as the Pod IP. The agent asks once before it serves; "" means the
// home has none and the agent's own -endpoint-host applies.
type EndpointHoster interface {
	EndpointHost() string
}

// IssuerOverrider is a home whose control-plane liveness can be forced, the
// test-only override behind the admin socket's POST /issuer: false marks
// the control plane unreachable now and keeps it so; true resumes.
type IssuerOverrider interface {
	SetIssuerReachable(reachable bool)
}
