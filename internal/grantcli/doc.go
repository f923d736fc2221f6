// Package grantcli is the one implementation of the grant key commands that
// two binaries offer under their own names: keygen, which makes an issuer
// signing key, and mint, which signs a grant token with it. fiberctl runs
// them as "fiberctl grant keygen|mint", grant-issuer as "grant-issuer
// keygen|mint"; both call Keygen and Mint here, so the flags, the checks,
// the messages and the exit statuses are the same code in both.
//
// It also owns the small flag helpers the commands are built on (NewFlags,
// ParseFlags, Required, UsageError, Failure) and the exit statuses they
// return (ExitOK, ExitFailure, ExitUsage), so that the other commands of
// the two binaries report errors the same way. Every message starts with
// the flag set's name, the command as the user typed it, and names the
// offending flag.
//
// It owns no state: a command reads its flags, the files they name and the
// clock of its Env, and writes the files it is asked to write.
//
// Who imports it: cmd/fiberctl and cmd/grant-issuer, nothing else. It
// imports pkg/core and pkg/grant. It is internal because its shape follows
// those two commands, not a public contract.
package grantcli
