package grantcli

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"k8s.io/utils/clock"
)

// Exit statuses of the commands: the same in both binaries.
const (
	// ExitOK is the status of a command that did its work, or printed its
	// help for -h.
	ExitOK = 0
	// ExitFailure is the status of a command whose flags were fine but
	// whose work failed: a file could not be read or written, a key could
	// not sign.
	ExitFailure = 1
	// ExitUsage is the status of a command called wrongly: an unknown or
	// malformed flag, a missing required flag, a value out of range, a
	// stray argument.
	ExitUsage = 2
)

// Env is what a command may touch besides its flags and the files they
// name. The binaries fill it from their own environment; tests pass
// buffers and a fake clock.
type Env struct {
	// Stdout receives the command's result (a kid, a token). Required.
	Stdout io.Writer
	// Stderr receives help and error messages. Required.
	Stderr io.Writer
	// Clock gives mint the issue time of a grant. Default (nil): the real
	// clock.
	Clock clock.PassiveClock
}

// clock returns e.Clock, or the real clock when it is nil.
func (e Env) clock() clock.PassiveClock {
	if e.Clock == nil {
		return clock.RealClock{}
	}
	return e.Clock
}

// NewFlags returns an empty flag set named name that prints its help and
// parse errors to stderr and returns parse errors rather than exiting, so
// the caller picks the exit status (see ParseFlags). name is the command as
// the user typed it, such as "fiberctl grant mint"; every message of the
// helpers below starts with it. Called by every command of both binaries.
func NewFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// ParseFlags parses args into fs and refuses positional arguments. ok true
// means go on; ok false means return status at once: ExitOK after -h (the
// flag package printed the help), ExitUsage after a bad flag (the flag
// package printed the message) or a stray argument (ParseFlags prints it).
func ParseFlags(fs *flag.FlagSet, args []string) (status int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK, false
		}
		return ExitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return ExitUsage, false
	}
	return ExitOK, true
}

// Required checks, after ParseFlags, that the flags of fs named by names
// are not empty, in the order given. ok true means all are set; ok false
// means the first empty one was reported as "-NAME is required" and status
// (ExitUsage) should be returned. A name fs does not define is a bug of
// the caller and panics.
func Required(fs *flag.FlagSet, names ...string) (status int, ok bool) {
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			panic(fmt.Sprintf("grantcli.Required: %s has no flag -%s", fs.Name(), name))
		}
		if f.Value.String() == "" {
			return UsageError(fs, "-%s is required", name), false
		}
	}
	return ExitOK, true
}

// UsageError prints "NAME: message" to the output of fs and returns
// ExitUsage. The message should name the offending flag.
func UsageError(fs *flag.FlagSet, format string, args ...any) int {
	fmt.Fprintf(fs.Output(), "%s: %s\n", fs.Name(), fmt.Sprintf(format, args...))
	return ExitUsage
}

// Failure prints "NAME: err" to the output of fs and returns ExitFailure.
func Failure(fs *flag.FlagSet, err error) int {
	fmt.Fprintf(fs.Output(), "%s: %v\n", fs.Name(), err)
	return ExitFailure
}
