// Package repotest locates the repository for tests that read or build its
// files (the docs check, the process and end-to-end tests): Root is the
// module root, the nearest directory holding go.mod from the test's working
// directory (its package directory under go test) upward.
//
// Who imports it: tests under test/ (docs, process, e2e). It imports only
// the standard library, and is internal because its shape follows those
// tests, not a public contract.
package repotest
