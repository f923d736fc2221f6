// Package devkit prepares the example templates of a fiberd checkout for
// local use: it finds the checkout, builds the C counter with the zygote
// SDK's build script, finds a Python interpreter, copies the Python example
// where an isolated grant can read it (SharePythonExample), and
// writes template specs for them.
//
// It owns no state of its own: every function works on the directories its
// caller names, except SharePythonExample, which keeps one copy per
// content of the Python example under ExamplesBase. Failures name the missing tool (cc, python3) or file,
// so a caller can skip a language and say why.
//
// Who imports it: cmd/fiberd (-dev), the benchmark program (bench) and
// tests. It imports pkg/core, pkg/template and pkg/backend (for
// ReadableByGrants), and is internal because its shape follows its
// callers, not a public contract.
package devkit
