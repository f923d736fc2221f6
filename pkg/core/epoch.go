package core

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// EpochStore is the agent's persistent incarnation counter, a decimal number
// in a file of the private state directory. Every start adds one and every
// scope loss (Bump) adds one, so fences minted before are older than every
// fence minted after, and fiber ids of an older epoch answer NotFound.
//
// The rules of the file: missing means the previous epoch was 0, so the
// first start runs epoch 1; corrupt or unreadable means the current Unix
// time, which is larger than any count a working file reached, and is
// logged. The new value is written to a temporary file, synced and renamed
// over the old one before it is used. A failed write leaves the previous
// file intact and is an error: the agent must not serve an epoch it could
// repeat after a crash.
//
// An EpochStore is safe for concurrent use.
type EpochStore struct {
	path string

	mu    sync.Mutex
	epoch uint64
}

// OpenEpochStore reads the epoch file at path, adds one, persists it and
// returns the store holding the new epoch. clk stamps the fallback of a
// corrupt file; log receives that line. It fails only when the new value
// cannot be persisted.
func OpenEpochStore(path string, clk clock.PassiveClock, log logr.Logger) (*EpochStore, error) {
	if clk == nil {
		clk = clock.RealClock{}
	}
	prev := uint64(0)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		n, perr := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if perr != nil || n == 0 {
			prev = uint64(clk.Now().Unix())
			log.Info("Epoch file is corrupt; starting from the current Unix time", "path", path, "content", truncate(string(b), 32), "epoch", prev+1)
		} else {
			prev = n
		}
	case os.IsNotExist(err):
	default:
		prev = uint64(clk.Now().Unix())
		log.Error(err, "Epoch file is unreadable; starting from the current Unix time", "path", path, "epoch", prev+1)
	}
	s := &EpochStore{path: path}
	if err := s.persist(prev + 1); err != nil {
		return nil, err
	}
	s.epoch = prev + 1
	return s, nil
}

// Current is the epoch in force.
func (s *EpochStore) Current() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch
}

// Bump adds one to the epoch, persists it, and returns the new value. The
// agent calls it when the home's scope is lost; every fence of the old epoch
// is then stale. On a write error the epoch in memory still moves forward
// (old fences must die either way) and the error is returned.
func (s *EpochStore) Bump() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch++
	return s.epoch, s.persist(s.epoch)
}

// Path is the epoch file.
func (s *EpochStore) Path() string { return s.path }

func (s *EpochStore) persist(n uint64) error {
	if err := WriteFileAtomic(s.path, []byte(strconv.FormatUint(n, 10)+"\n"), 0o600); err != nil {
		return fmt.Errorf("epoch file %s: %w", s.path, err)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
