package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// revocationPath is a revocations file's path in a new temporary directory.
func revocationPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "denied.json")
}

// openLedgerAt is OpenLedger at epoch 1 on the revocations file at path.
func openLedgerAt(t *testing.T, path string, now time.Time) *Ledger {
	t.Helper()
	l, err := OpenLedger(1, NewRevocationFile(path), now)
	if err != nil {
		t.Fatalf("OpenLedger: %v", err)
	}
	return l
}

// TestRevocationFileReadsTheExistingFormat: a file as fiberd has written it
// in existing state directories loads, and Save writes that format back,
// readable by its owner only.
func TestRevocationFileReadsTheExistingFormat(t *testing.T) {
	path := revocationPath(t)
	old := "{\n  \"version\": 1,\n  \"denied\": {\n    \"g1\": \"2026-12-05T16:00:00Z\"\n  }\n}\n"
	if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	f := NewRevocationFile(path)
	revs, err := f.Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := map[string]time.Time{"g1": time.Date(2026, 12, 5, 16, 0, 0, 0, time.UTC)}
	if len(revs) != 1 || !revs["g1"].Equal(want["g1"]) {
		t.Fatalf("Load = %v, want %v", revs, want)
	}
	if err := f.Save(revs); err != nil {
		t.Fatalf("Save: %v", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != old {
		t.Errorf("Save wrote\n%s\nwant the format it read\n%s", b, old)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
}

// TestRevocationFileMissingIsEmpty: no file is no revocations, not an
// error.
func TestRevocationFileMissingIsEmpty(t *testing.T) {
	revs, err := NewRevocationFile(revocationPath(t)).Load()
	if err != nil || revs == nil || len(revs) != 0 {
		t.Fatalf("Load of a missing file = %v, %v; want an empty map", revs, err)
	}
}

// TestRevocationFileCorrupt: a file that does not parse, or is of another
// version, is an error naming the file, saying to move it away, and
// wrapping ErrInvalid; so is OpenLedger on it.
func TestRevocationFileCorrupt(t *testing.T) {
	for name, content := range map[string]string{
		"truncated":     `{"version": 1, "denied": {"g1": "2026-`,
		"other version": `{"version": 2, "denied": {}}`,
		"no version":    `{"denied": {}}`,
		"bad end":       `{"version": 1, "denied": {"g1": "tomorrow"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := revocationPath(t)
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := NewRevocationFile(path).Load()
			checkCorrupt(t, "Load", err, path)
			_, err = OpenLedger(1, NewRevocationFile(path), t0)
			checkCorrupt(t, "OpenLedger", err, path)
			if b, _ := os.ReadFile(path); string(b) != content {
				t.Errorf("the corrupt file changed to %q", b)
			}
		})
	}
}

func checkCorrupt(t *testing.T, what string, err error, path string) {
	t.Helper()
	if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "move it away") {
		t.Errorf("%s of a corrupt file: %v; want ErrInvalid naming %s and saying to move it away", what, err, path)
	}
}

// TestRevocationFileRefusesALargeFile: Load reads at most 8 MiB.
func TestRevocationFileRefusesALargeFile(t *testing.T) {
	path := revocationPath(t)
	if err := os.WriteFile(path, make([]byte, revocationFileMax+1), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := NewRevocationFile(path).Load()
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Load of a file over %d bytes: %v; want ErrInvalid naming it", revocationFileMax, err)
	}
}

// TestLedgerDenyKeepsTheLaterEnd: Deny never shortens a revocation.
func TestLedgerDenyKeepsTheLaterEnd(t *testing.T) {
	l := NewLedger(1)
	if until, ok := l.DeniedUntil("g"); ok {
		t.Fatalf("DeniedUntil of a grant never denied = %v, true", until)
	}
	late, early, later := t0.Add(2*time.Hour), t0.Add(time.Hour), t0.Add(3*time.Hour)
	for _, end := range []time.Time{late, early} {
		if err := l.Deny("g", end); err != nil {
			t.Fatal(err)
		}
	}
	if until, ok := l.DeniedUntil("g"); !ok || !until.Equal(late) {
		t.Fatalf("DeniedUntil after Deny to %v then %v = %v, %v; want the later", late, early, until, ok)
	}
	if err := l.Deny("g", later); err != nil {
		t.Fatal(err)
	}
	if until, _ := l.DeniedUntil("g"); !until.Equal(later) {
		t.Fatalf("DeniedUntil after Deny to %v = %v", later, until)
	}
	if revs := l.Revocations(); len(revs) != 1 || !revs["g"].Equal(later) {
		t.Fatalf("Revocations = %v, want g until %v", revs, later)
	}
	if was, err := l.Lift("g"); !was || err != nil {
		t.Fatalf("Lift = %v, %v; want true", was, err)
	}
	if was, err := l.Lift("g"); was || err != nil {
		t.Fatalf("second Lift = %v, %v; want false", was, err)
	}
	if l.Denied("g") {
		t.Fatal("denied after Lift")
	}
}

// TestLedgerRevocationsPersistAndLapse: what Deny and Lift change is in the
// file, a ledger opened on it again refuses the grants still revoked, and
// drops those whose end passed.
func TestLedgerRevocationsPersistAndLapse(t *testing.T) {
	path := revocationPath(t)
	l := openLedgerAt(t, path, t0)
	for uid, end := range map[string]time.Time{"long": t0.Add(2 * time.Hour), "short": t0.Add(30 * time.Minute), "lifted": t0.Add(2 * time.Hour)} {
		if err := l.Deny(uid, end); err != nil {
			t.Fatalf("Deny %s: %v", uid, err)
		}
	}
	if _, err := l.Lift("lifted"); err != nil {
		t.Fatalf("Lift: %v", err)
	}

	again := openLedgerAt(t, path, t0.Add(time.Hour))
	if until, ok := again.DeniedUntil("long"); !ok || !until.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("after reopening, long revoked until %v, %v; want %v", until, ok, t0.Add(2*time.Hour))
	}
	if _, err := again.Admit(testGrant("long", 1)); !errors.Is(err, ErrDenied) {
		t.Fatalf("admit of a revoked grant after reopening: %v, want ErrDenied", err)
	}
	if again.Denied("short") {
		t.Fatal("a revocation whose end passed before the open is still in force")
	}
	if again.Denied("lifted") {
		t.Fatal("a lifted revocation came back after reopening")
	}
	if got := again.Revocations(); len(got) != 1 {
		t.Fatalf("Revocations after reopening = %v, want long only", got)
	}
	// A revocation ending exactly at the open has ended.
	if openLedgerAt(t, path, t0.Add(2*time.Hour)).Denied("long") {
		t.Fatal("a revocation ending at the open is in force")
	}
}

// TestLedgerFailedWriteKeepsTheOldFile: when the file cannot be written, Deny
// returns the error naming it, the revocation holds in memory, and the file
// keeps what it held. The file's name is long enough that the temporary
// file beside it cannot be created (ENAMETOOLONG), which fails the same way
// whoever runs the test.
func TestLedgerFailedWriteKeepsTheOldFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), strings.Repeat("d", 250))
	old := fmt.Sprintf("{\"version\": 1, \"denied\": {\"g1\": %q}}\n", t0.Add(time.Hour).UTC().Format(time.RFC3339))
	if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	l := openLedgerAt(t, path, t0)
	if !l.Denied("g1") {
		t.Fatal("the existing revocation did not load")
	}
	err := l.Deny("g2", t0.Add(time.Hour))
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Deny with an unwritable file: %v; want an error naming %s", err, path)
	}
	if !l.Denied("g2") {
		t.Fatal("a revocation whose write failed is not in force")
	}
	if _, _, err := l.Reserve("g2", "", t0); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("clone of a grant whose revocation failed to persist: %v, want a miss", err)
	}
	if b, _ := os.ReadFile(path); string(b) != old {
		t.Fatalf("file after a failed write = %q, want the old %q", b, old)
	}
}

// flakyStore is a RevocationStore in memory whose Save fails while fail is
// set, and whose Save can be held by a test. It records overlapping Saves.
type flakyStore struct {
	fail    atomic.Bool
	hold    chan struct{} // when non-nil, Save waits for a receive on it
	inSave  chan struct{} // when non-nil, Save sends on it on entry
	active  atomic.Int32
	overlap atomic.Bool

	mu    sync.Mutex
	saved map[string]time.Time
	saves int
}

func (s *flakyStore) Load() (map[string]time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.saved), nil
}

func (s *flakyStore) Save(revs map[string]time.Time) error {
	if s.active.Add(1) > 1 {
		s.overlap.Store(true)
	}
	defer s.active.Add(-1)
	if s.inSave != nil {
		s.inSave <- struct{}{}
	}
	if s.hold != nil {
		<-s.hold
	}
	if s.fail.Load() {
		return errors.New("disk full")
	}
	time.Sleep(100 * time.Microsecond) // a write takes a while
	s.mu.Lock()
	defer s.mu.Unlock()
	s.saved = maps.Clone(revs)
	s.saves++
	return nil
}

func (s *flakyStore) snapshot() (map[string]time.Time, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.saved), s.saves
}

// TestLedgerWritesAgainAfterAFailedWrite: a change whose write failed is
// written by the next Deny or Lift, even one that changes nothing.
func TestLedgerWritesAgainAfterAFailedWrite(t *testing.T) {
	st := &flakyStore{}
	l, err := OpenLedger(1, st, t0)
	if err != nil {
		t.Fatal(err)
	}
	st.fail.Store(true)
	if err := l.Deny("g1", t0.Add(time.Hour)); err == nil {
		t.Fatal("Deny with a failing store: no error")
	}
	st.fail.Store(false)
	if was, err := l.Lift("other"); was || err != nil {
		t.Fatalf("Lift of a grant not revoked = %v, %v", was, err)
	}
	saved, _ := st.snapshot()
	if !saved["g1"].Equal(t0.Add(time.Hour)) {
		t.Fatalf("store after the next Lift holds %v, want g1", saved)
	}
	// Nothing left to write: a Deny that changes nothing writes nothing.
	_, n := st.snapshot()
	if err := l.Deny("g1", t0); err != nil {
		t.Fatal(err)
	}
	if _, m := st.snapshot(); m != n {
		t.Fatalf("a Deny that changed nothing wrote the store (%d writes, want %d)", m, n)
	}
}

// TestLedgerReadersDoNotWaitForTheStore: while a Save is in progress, the
// ledger answers every other call, and a second Deny is in force at once.
func TestLedgerReadersDoNotWaitForTheStore(t *testing.T) {
	st := &flakyStore{hold: make(chan struct{}), inSave: make(chan struct{}, 2)}
	l, err := OpenLedger(1, st, t0)
	if err != nil {
		t.Fatal(err)
	}
	l.Admit(testGrant("g", 1))
	denied := make(chan error, 2)
	go func() { denied <- l.Deny("r1", t0.Add(time.Hour)) }()
	<-st.inSave // the first Save holds the store now
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		go func() { denied <- l.Deny("r2", t0.Add(time.Hour)) }()
		for !l.Denied("r2") {
			time.Sleep(time.Millisecond)
		}
		if !l.Denied("r1") || len(l.Revocations()) != 2 || len(l.Snapshot()) != 1 {
			t.Error("the ledger during a Save does not show both revocations and the grant")
		}
		if _, _, err := l.Reserve("g", "", t0); err != nil {
			t.Errorf("Reserve during a Save: %v", err)
		}
	}()
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the ledger did not answer while its store was writing")
	}
	go func() {
		for range 2 {
			st.hold <- struct{}{}
		}
	}()
	for range 2 {
		if err := <-denied; err != nil {
			t.Fatal(err)
		}
	}
	if saved, _ := st.snapshot(); len(saved) != 2 {
		t.Fatalf("store after both Denies holds %v, want r1 and r2", saved)
	}
}

// TestLedgerConcurrentDeny: Denies from many goroutines each return once
// their revocation is written, never write the store at the same time, and
// leave a file holding all of them.
func TestLedgerConcurrentDeny(t *testing.T) {
	st := &flakyStore{}
	l, err := OpenLedger(1, st, t0)
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			uid := fmt.Sprintf("g%d", i)
			if err := l.Deny(uid, t0.Add(time.Hour)); err != nil {
				t.Error(err)
				return
			}
			if saved, _ := st.snapshot(); saved[uid].IsZero() {
				t.Errorf("Deny(%s) returned before the store held it", uid)
			}
		})
	}
	wg.Wait()
	if st.overlap.Load() {
		t.Error("two Saves ran at the same time")
	}
	if saved, _ := st.snapshot(); len(saved) != n {
		t.Fatalf("store holds %d revocations, want %d", len(saved), n)
	}

	path := revocationPath(t)
	lf := openLedgerAt(t, path, t0)
	for i := range n {
		wg.Go(func() {
			if err := lf.Deny(fmt.Sprintf("g%d", i), t0.Add(time.Hour)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Denied map[string]time.Time `json:"denied"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || len(doc.Denied) != n {
		t.Fatalf("file after %d concurrent Denies holds %d (%v), want all", n, len(doc.Denied), err)
	}
}
