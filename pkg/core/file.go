package core

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// ReadFileBounded reads the regular file at path, refusing it, before it is
// read whole, when it holds more than limit bytes. A path that is not a
// regular file (a FIFO, a device) is refused before it is opened, so a
// reader never blocks on it. Both refusals are *fs.PathError values naming
// path and wrapping ErrInvalid; a missing file fails with fs.ErrNotExist.
// Readers of files an operator or a kubelet writes call it: key files and
// JWKS documents (pkg/grant), the projected service-account token and the
// grant file (pkg/home/kubernetes), template specs (pkg/template).
func ReadFileBounded(path string, limit int64) ([]byte, error) {
	if st, err := os.Stat(path); err != nil {
		return nil, err
	} else if !st.Mode().IsRegular() {
		return nil, notRegular(path, st.Mode())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return nil, err
	} else if !st.Mode().IsRegular() { // replaced since the Stat
		return nil, notRegular(path, st.Mode())
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, &os.PathError{Op: "read", Path: path, Err: fmt.Errorf("over the %d-byte limit: %w", limit, ErrInvalid)}
	}
	return b, nil
}

func notRegular(path string, m os.FileMode) error {
	return &os.PathError{Op: "read", Path: path, Err: fmt.Errorf("not a regular file (%s): %w", m.Type(), ErrInvalid)}
}

// WriteFileAtomic writes data to path so that a reader sees the old content
// or the new, never a part: a temporary file in the same directory, synced,
// renamed over path, and the directory synced. On any error the temporary
// file is removed and path is left as it was.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	if err := writeFileAtomic(path, data, perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func writeFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err = f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err = f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
