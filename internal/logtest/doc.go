// Package logtest records what a logr.Logger logs, for tests that assert
// what was logged (a refusal names its reason, a warning comes once, a
// secret never reaches the log).
//
// A Recorder's zero value is ready: give its Logger to the code under test,
// then ask Count, Matching, Lines or String. Tests that only need silence
// use logr.Discard() or testr instead.
//
// Who imports it: tests of pkg/cgroup, pkg/home, pkg/home/kubernetes and
// cmd/grant-issuer. It imports logr and its funcr, nothing of the project,
// and is internal because its shape follows those tests, not a public
// contract.
package logtest
