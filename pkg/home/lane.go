package home

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/core"
)

// DefaultGrantsPoll is how often a file lane reads its directory when
// FileLaneConfig.Poll is zero.
const DefaultGrantsPoll = 2 * time.Second

// MaxTokenSize is the largest grant file the lane reads: the size cap of a
// grant token, core.MaxTokenSize (8 KiB). A larger file is refused by the
// size its stat reports, before it is opened.
const MaxTokenSize = core.MaxTokenSize

// TokenSuffix is the name suffix of the files the lane reads.
const TokenSuffix = ".jwt"

// FileLaneConfig is what a file-fed home hands NewFileLane.
type FileLaneConfig struct {
	// Dir is the directory of grant files. Required. It is created with
	// mode 0700 when missing, by NewFileLane and again by a poll that
	// finds it gone.
	Dir string
	// Poll is how often Dir is read. Default DefaultGrantsPoll. Negative
	// is an error.
	Poll time.Duration
	// Clock drives the polls. Default the real clock.
	Clock clock.WithTicker
	// Logger receives the lane's log lines. Default klog's.
	Logger logr.Logger
	// PeekUID reads a grant's UID from its token without verifying it.
	// Required; homes pass grant.PeekUID. An error marks the file
	// malformed: it is logged once and skipped until it changes.
	PeekUID func(token []byte) (string, error)
}

// withDefaults fills the zero fields of c. It does no I/O.
func (c FileLaneConfig) withDefaults() FileLaneConfig {
	if c.Poll == 0 {
		c.Poll = DefaultGrantsPoll
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	return c
}

// Validate reports the first thing wrong with c, after defaults, naming
// the field and the fix.
func (c FileLaneConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Dir == "":
		return errors.New("file lane: Dir is empty: set the grants directory")
	case c.Poll < 0:
		return fmt.Errorf("file lane: Poll %v is negative: set a positive interval, or zero for %v", c.Poll, DefaultGrantsPoll)
	case c.PeekUID == nil:
		return errors.New("file lane: PeekUID is nil: pass grant.PeekUID")
	}
	return nil
}

// FileLane is the lane every file-fed home shares: it polls a directory of
// grant tokens, one compact JWT per *.jwt file, and turns what it finds into
// GrantEvents.
//
// Each poll reads the regular files whose names end in ".jwt" and do not
// start with a dot. Stat follows symlinks, so the "..data" links of a
// Kubernetes projected volume work. FIFOs, devices, sockets and directories
// are skipped, logged once and never opened. A file that is new, or changed
// in size, modification time or content, is GrantAdded. A UID no file
// carries any more is GrantRemoved, with the UID peeked from the last copy
// read, and a file that turns malformed or oversized counts as gone. A
// malformed file (PeekUID fails) or one over MaxTokenSize is logged once
// per version and skipped; once fixed it is delivered. A file that cannot
// be read this poll for another reason keeps its last state, so a passing
// error never revokes a grant, and neither does a directory that cannot be
// listed; a directory that is gone has lost every file, and is created
// again. Writers write a temporary name (a dot prefix, or another suffix)
// and rename it into place. When several files carry one UID, the UID is
// removed only with the last of them.
//
// Events are ordered per poll: removals first, then additions, each by
// file name. The first poll happens as soon as Events is called.
type FileLane struct {
	cfg FileLaneConfig
	log logr.Logger

	mu      sync.Mutex
	started bool
	done    chan struct{}

	// Poll state, touched only by the lane's goroutine.
	files   map[string]delivered // by file name: the last version delivered
	skipped map[string]skip      // by file name: why it was skipped, as logged
	dirErr  string               // the last directory error logged
}

// version is what tells a file's copies apart. hash is zero when the file
// was not read.
type version struct {
	size  int64
	mtime int64
	hash  [sha256.Size]byte
}

// delivered is a file the lane has delivered.
type delivered struct {
	v   version
	uid string
}

// skip is why a file was skipped, kept so the reason is logged once.
type skip struct {
	v      version
	reason string
}

// NewFileLane validates cfg, fills its defaults and creates cfg.Dir with
// mode 0700 when it is missing. It reads no grant; that starts with Events.
// It fails on an invalid cfg, or when Dir cannot be created or is not a
// directory. File-fed homes call it from their constructors.
func NewFileLane(cfg FileLaneConfig) (*FileLane, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("grants directory %q: %w", cfg.Dir, err)
	}
	fi, err := os.Stat(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("grants directory %q: %w", cfg.Dir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("grants directory %q: not a directory", cfg.Dir)
	}
	return &FileLane{
		cfg:     cfg,
		log:     cfg.Logger.WithName("file-lane").WithValues("dir", cfg.Dir),
		done:    make(chan struct{}),
		files:   make(map[string]delivered),
		skipped: make(map[string]skip),
	}, nil
}

// Events starts the lane's goroutine and returns its channel. The first
// poll runs at once, then one every Poll. When ctx ends the goroutine stops,
// also in the middle of a send, and closes the channel as its last act, so
// a reader that drains the channel knows the lane has stopped. A home's
// Grants returns the channel as is. Events may be called once; a second
// call is an error.
func (l *FileLane) Events(ctx context.Context) (<-chan GrantEvent, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started {
		return nil, fmt.Errorf("file lane %q: Events already called", l.cfg.Dir)
	}
	l.started = true
	out := make(chan GrantEvent)
	go l.run(ctx, out)
	return out, nil
}

// Wait blocks until the goroutine Events started has ended. It returns at
// once when Events was never called. A home's Close calls it after its
// Run's context has ended.
func (l *FileLane) Wait() {
	l.mu.Lock()
	started := l.started
	l.mu.Unlock()
	if started {
		<-l.done
	}
}

func (l *FileLane) run(ctx context.Context, out chan<- GrantEvent) {
	defer close(l.done)
	defer close(out)
	ticker := l.cfg.Clock.NewTicker(l.cfg.Poll)
	defer ticker.Stop()
	for {
		if ctx.Err() != nil {
			return
		}
		for _, ev := range l.poll() {
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
	}
}

// poll reads the directory once, updates the lane's state and returns the
// events of what changed since the last poll.
func (l *FileLane) poll() []GrantEvent {
	dir := l.cfg.Dir
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		// Every file is gone with the directory; recreate it so writers
		// can write again.
		entries, err = nil, os.MkdirAll(dir, 0o700)
	}
	if err != nil {
		if msg := err.Error(); msg != l.dirErr {
			l.log.Error(err, "Cannot read the grants directory; keeping the grants read before")
			l.dirErr = msg
		}
		return nil
	}
	if l.dirErr != "" {
		l.log.Info("Grants directory readable again")
		l.dirErr = ""
	}

	files := make(map[string]delivered, len(l.files))
	skipped := make(map[string]skip)
	var added []GrantEvent
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, TokenSuffix) || strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(dir, name)
		r := l.read(name, path)
		if r.why.reason != "" {
			skipped[name] = r.why
			if old, ok := l.skipped[name]; !ok || old != r.why {
				l.log.Info("Skipping grant file", "path", path, "reason", r.why.reason)
			}
		}
		switch r.state {
		case fileKept:
			if old, ok := l.files[name]; ok {
				files[name] = old
			}
		case fileUnchanged:
			files[name] = r.d
		case fileChanged:
			files[name] = r.d
			added = append(added, GrantEvent{Kind: GrantAdded, UID: r.d.uid, Token: r.token, Path: path})
		}
	}

	carried := make(map[string]bool, len(files))
	for _, d := range files {
		carried[d.uid] = true
	}
	var removed []GrantEvent
	for _, name := range slices.Sorted(maps.Keys(l.files)) {
		d := l.files[name]
		if carried[d.uid] {
			continue
		}
		carried[d.uid] = true // one removal per UID
		removed = append(removed, GrantEvent{Kind: GrantRemoved, UID: d.uid, Path: filepath.Join(dir, name)})
	}

	l.files, l.skipped = files, skipped
	return append(removed, added...)
}

// fileState is what one poll found of a file.
type fileState int

const (
	// fileGone: the file, or its link's target, is gone.
	fileGone fileState = iota
	// fileInvalid: not a regular file, too large, or malformed; it counts
	// as gone.
	fileInvalid
	// fileKept: it could not be read this poll; its last state stands.
	fileKept
	// fileUnchanged: the copy delivered last.
	fileUnchanged
	// fileChanged: a new or changed copy with a good UID, to deliver.
	fileChanged
)

// readResult is what read found: the state, the file's delivered form
// (unchanged, changed), the token (changed) and the reason it is skipped or
// kept, logged once.
type readResult struct {
	state fileState
	d     delivered
	token []byte
	why   skip
}

// read looks at one *.jwt file. It opens it only when stat says it is a
// regular file no larger than MaxTokenSize, and opens it without blocking
// in case it was swapped for a FIFO since.
func (l *FileLane) read(name, path string) readResult {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return readResult{state: fileGone} // a dangling link, or removed meanwhile
	}
	if err != nil {
		return unreadable(err)
	}
	if !fi.Mode().IsRegular() {
		return readResult{state: fileInvalid, why: skip{reason: "not a regular file (" + fileKind(fi.Mode()) + "); not opened"}}
	}
	v := version{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if fi.Size() > MaxTokenSize {
		return readResult{state: fileInvalid, why: skip{v: v, reason: fmt.Sprintf("%d bytes, over the %d-byte token cap; not read", fi.Size(), MaxTokenSize)}}
	}
	f, err := openNoBlock(path)
	if errors.Is(err, fs.ErrNotExist) {
		return readResult{state: fileGone}
	}
	if err != nil {
		return unreadable(err)
	}
	defer f.Close()
	ofi, err := f.Stat()
	if err != nil {
		return unreadable(err)
	}
	if !ofi.Mode().IsRegular() || !os.SameFile(fi, ofi) {
		// Replaced between stat and open; the next poll sees the new file.
		return readResult{state: fileKept}
	}
	token, err := io.ReadAll(io.LimitReader(f, MaxTokenSize+1))
	if err != nil {
		return unreadable(err)
	}
	if len(token) > MaxTokenSize {
		return readResult{state: fileInvalid, why: skip{v: v, reason: fmt.Sprintf("grew over the %d-byte token cap", MaxTokenSize)}}
	}
	v.size = int64(len(token))
	v.hash = sha256.Sum256(token)
	if old, ok := l.files[name]; ok && old.v == v {
		return readResult{state: fileUnchanged, d: old}
	}
	if old, ok := l.skipped[name]; ok && old.v == v {
		return readResult{state: fileInvalid, why: old} // the same malformed copy, peeked before
	}
	uid, err := l.cfg.PeekUID(token)
	if err != nil {
		return readResult{state: fileInvalid, why: skip{v: v, reason: "malformed token: " + err.Error()}}
	}
	return readResult{state: fileChanged, d: delivered{v: v, uid: uid}, token: token}
}

// unreadable is a file that could not be read this poll: its last state
// stands and the error is logged once.
func unreadable(err error) readResult {
	return readResult{state: fileKept, why: skip{reason: "unreadable, keeping its last state: " + err.Error()}}
}

// fileKind names a non-regular file's type for the log.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	}
	return "irregular file"
}
