package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"time"
)

// RevocationStore keeps a ledger's revocations across restarts: each revoked
// grant UID and the end of its revocation. The ledger calls it outside its
// own lock, one call at a time (see Ledger), so an implementation needs no
// lock of its own for the ledger's sake.
type RevocationStore interface {
	// Load returns the revocations last saved. Nothing saved yet is an
	// empty map and no error; anything that cannot be read back whole is
	// an error, since a revocation must not be forgotten silently.
	Load() (map[string]time.Time, error)
	// Save replaces what is saved with revs, which it must not keep or
	// change. When it fails, what was saved before is still what Load
	// returns.
	Save(revs map[string]time.Time) error
}

// revocationFileMax caps the revocations file read by Load: 8 MiB, tens of
// thousands of entries.
const revocationFileMax = 8 << 20

// revocationFileVersion is the only version of the file's format.
const revocationFileVersion = 1

// revocationDoc is the revocations file's content, as fiberd has written it
// since revocations were first persisted.
type revocationDoc struct {
	// Version is revocationFileVersion.
	Version int `json:"version"`
	// Denied maps a grant UID to the end of its revocation.
	Denied map[string]time.Time `json:"denied"`
}

// RevocationFile is a RevocationStore in one JSON file, fiberd's
// StateDir/private/denied.json: {"version": 1, "denied": {uid: end}}, ends
// in RFC 3339. Save writes a temporary file in the same directory, syncs it
// and renames it over the file (WriteFileAtomic), so a crash or a failed
// write leaves the previous file whole. It is safe for concurrent use as
// far as WriteFileAtomic is: concurrent Saves each leave a whole file, the
// last rename's.
type RevocationFile struct {
	path string
}

// NewRevocationFile returns the store kept in the file at path. It touches
// nothing until Load or Save.
func NewRevocationFile(path string) *RevocationFile {
	return &RevocationFile{path: path}
}

// Path is the file the store is kept in.
func (f *RevocationFile) Path() string { return f.path }

// Load reads the file. A missing file is no revocations. A file that cannot
// be read, or is over 8 MiB, is an error naming it; one that does not parse
// or is of another version is an error naming it, saying to move it away,
// and wrapping ErrInvalid.
func (f *RevocationFile) Load() (map[string]time.Time, error) {
	b, err := ReadFileBounded(f.path, revocationFileMax)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return map[string]time.Time{}, nil
	case err != nil:
		return nil, fmt.Errorf("revocations file: %w", err)
	}
	var doc revocationDoc
	if err := json.Unmarshal(b, &doc); err != nil || doc.Version != revocationFileVersion {
		if err == nil {
			err = fmt.Errorf("version %d, want %d", doc.Version, revocationFileVersion)
		}
		return nil, fmt.Errorf("revocations file %s is corrupt (%v): move it away to start without the revocations it held: %w", f.path, err, ErrInvalid)
	}
	if doc.Denied == nil {
		doc.Denied = map[string]time.Time{}
	}
	return doc.Denied, nil
}

// Save replaces the file's content with revs, readable by its owner only
// (0600). On error, which names the file, the previous file is left as it
// was.
func (f *RevocationFile) Save(revs map[string]time.Time) error {
	doc := revocationDoc{Version: revocationFileVersion, Denied: revs}
	if doc.Denied == nil {
		doc.Denied = map[string]time.Time{}
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("revocations file %s: %w", f.path, err)
	}
	if err := WriteFileAtomic(f.path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("revocations file: %w", err)
	}
	return nil
}
