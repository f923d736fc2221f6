package fiberd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"sync"
	"time"

	"fiberd.io/fiberd/pkg/core"
)

// denyFileMax caps the revocations file read at start: 8 MiB, tens of
// thousands of entries.
const denyFileMax = 8 << 20

// denyFile is the revocations file's content.
type denyFile struct {
	// Version is 1.
	Version int `json:"version"`
	// Denied maps a grant UID to the end of its revocation.
	Denied map[string]time.Time `json:"denied"`
}

// denyList is the revocations: grants their lane removed, refused until the
// lane delivers them again or the revocation expires. It is kept in
// StateDir/private/denied.json (a temporary file, synced and renamed), so a
// restart keeps refusing a revoked grant that a caller replays by token.
// The ledger holds the same set in memory (Ledger.Deny, Lift); the agent
// changes both, the ledger first.
type denyList struct {
	path string

	mu      sync.Mutex // guards until and version; never held across I/O
	until   map[string]time.Time
	version uint64 // counts changes of until

	// writeMu serialises writes of the file. It is held across the write
	// and guards written; nothing else takes it, so no reader of the list
	// ever waits for the disk.
	writeMu sync.Mutex
	written uint64 // the version the file holds
}

// openDenyList reads the revocations file at path, dropping entries that
// ended before now. A missing file is an empty list. A file that cannot be
// read or parsed is an error naming it: revocations must not be forgotten
// silently.
func openDenyList(path string, now time.Time) (*denyList, error) {
	d := &denyList{path: path, until: map[string]time.Time{}}
	b, err := core.ReadFileBounded(path, denyFileMax)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return d, nil
	case err != nil:
		return nil, fmt.Errorf("revocations file: %w", err)
	}
	var f denyFile
	if err := json.Unmarshal(b, &f); err != nil || f.Version != 1 {
		if err == nil {
			err = fmt.Errorf("version %d, want 1", f.Version)
		}
		return nil, fmt.Errorf("revocations file %s is corrupt (%v): move it away to start without the revocations it held: %w", path, err, core.ErrInvalid)
	}
	for uid, t := range f.Denied {
		if now.Before(t) {
			d.until[uid] = t
		}
	}
	return d, nil
}

// add denies uid until the given time, or keeps a later end already
// recorded, and persists the list.
func (d *denyList) add(uid string, until time.Time) error {
	d.mu.Lock()
	if old, ok := d.until[uid]; ok && !old.Before(until) {
		d.mu.Unlock()
		return nil
	}
	d.until[uid] = until
	d.version++
	d.mu.Unlock()
	return d.persist()
}

// lift ends uid's revocation and persists the list. It reports whether uid
// was denied.
func (d *denyList) lift(uid string) (bool, error) {
	d.mu.Lock()
	if _, ok := d.until[uid]; !ok {
		d.mu.Unlock()
		return false, nil
	}
	delete(d.until, uid)
	d.version++
	d.mu.Unlock()
	return true, d.persist()
}

// get is the end of uid's revocation, if it is denied.
func (d *denyList) get(uid string) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	t, ok := d.until[uid]
	return t, ok
}

// all is every revocation.
func (d *denyList) all() map[string]time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.until)
}

// persist writes the list when the file is older than it. Concurrent calls
// write in turn; a call that finds its change already written by another
// returns at once.
func (d *denyList) persist() error {
	d.writeMu.Lock()
	defer d.writeMu.Unlock()
	d.mu.Lock()
	v := d.version
	f := denyFile{Version: 1, Denied: maps.Clone(d.until)}
	d.mu.Unlock()
	if v <= d.written {
		return nil
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := core.WriteFileAtomic(d.path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("revocations file: %w", err)
	}
	d.written = v
	return nil
}
