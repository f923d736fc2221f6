//go:build !linux

package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/go-logr/logr"
)

// errUnsupported is what every kernel-facing call returns off Linux.
var errUnsupported = fmt.Errorf("cgroup v2 needs Linux: %w", errors.ErrUnsupported)

type warnFunc func(key, msg string, kv ...any)

func mount() (string, error)                                  { return "", errUnsupported }
func self() (string, error)                                   { return "", errUnsupported }
func delegate(string, logr.Logger) (string, error)            { return "", errUnsupported }
func checkDir(string) error                                   { return errUnsupported }
func makeDir(string) error                                    { return errUnsupported }
func enableControllers(string, warnFunc) error                { return errUnsupported }
func openDir(string) (*os.File, error)                        { return nil, errUnsupported }
func openEntry(string) (*os.File, error)                      { return nil, errUnsupported }
func chownProcs(string, int) error                            { return errUnsupported }
func enterFD(int) error                                       { return errUnsupported }
func addProc(string, int) error                               { return errUnsupported }
func readProcs(string) ([]int, error)                         { return nil, errUnsupported }
func kill(context.Context, string) error                      { return errUnsupported }
func waitEvent(context.Context, string, string, string) error { return errUnsupported }
func freeze(context.Context, string, bool) error              { return errUnsupported }
func removeTree(string) error                                 { return errUnsupported }
func readPressure(string, string) (float64, bool, error)      { return 0, false, errUnsupported }
func enabled(string, string) (bool, error)                    { return false, errUnsupported }
func setMemoryLimit(string, int64, int64) error               { return errUnsupported }
func oomKills(string) (int64, bool, error)                    { return 0, false, errUnsupported }
func setPidsMax(string, int64) error                          { return errUnsupported }
func setCPUWeight(string, int) error                          { return errUnsupported }
