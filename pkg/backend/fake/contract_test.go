package fake_test

import (
	"encoding/hex"
	"testing"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/backend/backendtest"
	"fiberd.io/fiberd/pkg/backend/fake"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

// TestCheckpointerContract: the fake's Checkpointer keeps the contract the
// proc backend's keeps (pkg/backend's TestCheckpointerContract), so that
// what the agent's tests learn from it holds with CRIU too. A fake fiber
// runs no process: its memory is the request it was cloned with.
func TestCheckpointerContract(t *testing.T) {
	backendtest.CheckpointerContract(t, backendtest.Subject{
		New: func(*testing.T) backendtest.Checkpointing {
			b := fake.New(core.TierWarm, fake.Hooks{})
			b.EnableCheckpoint(1 << 20)
			return b
		},
		Absent: func(*testing.T) backendtest.Checkpointing { return fake.New(core.TierWarm, fake.Hooks{}) },
		Spec:   func(*testing.T) template.Spec { return template.Spec{Command: "/bin/true", Zygote: true} },
		Memory: func(t *testing.T, b backendtest.Checkpointing, f backend.Fiber, _ string) backendtest.Memory {
			t.Helper()
			req, ok := b.(*fake.Backend).Request(f.Fence)
			if !ok {
				t.Fatalf("fiber %s does not run", f.Fence)
			}
			return backendtest.Memory{Payload: hex.EncodeToString(req.Payload), Count: -1}
		},
	})
}
