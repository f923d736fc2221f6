// Package backendtest holds the contracts every implementation of a
// pkg/backend interface keeps, as helpers a test of that implementation
// calls: CheckpointerContract, for a backend.Checkpointer (the proc
// backend with CRIU, and the fake of pkg/backend/fake), so that what the
// agent relies on holds for both alike.
//
// A contract checks what the interface's doc comments promise, through the
// interface only; what it cannot see (a process's memory) it asks of the
// implementation's test through a Subject's hooks. CRIU finds the CRIU a
// test of the real backend runs, or skips the test saying what is missing
// (fails instead with FIBERD_CRIU_REQUIRED=1, as in CI).
//
// Nothing but tests imports it.
package backendtest
