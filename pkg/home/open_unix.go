//go:build unix

package home

import (
	"os"
	"syscall"
)

// openNoBlock opens path for reading with O_NONBLOCK, so a file swapped
// for a FIFO after its stat cannot hang the poll. O_NONBLOCK changes
// nothing for a regular file.
func openNoBlock(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
}
