//go:build !unix

package home

import "os"

// openNoBlock opens path for reading. Without unix there are no FIFOs to
// guard against, so it is a plain open.
func openNoBlock(path string) (*os.File, error) {
	return os.Open(path)
}
