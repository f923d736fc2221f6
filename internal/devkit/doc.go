// Package devkit prepares the example templates of a fiberd checkout for
// local use: it finds the checkout, builds the C counter with the zygote
// SDK's build script, finds the Python interpreter, and writes template specs
// for them.
//
// It owns no state of its own: every function works on the directories its
// caller names. Failures name the missing tool (cc, python3) or file, so a
// caller can skip a language and say why.
//
// Who imports it: cmd/fiberd (-dev) and the benchmark program (bench). It
// imports pkg/core and pkg/template, nothing else of the project, and is
// internal because its shape follows those two callers, not a public
// contract.
package devkit
