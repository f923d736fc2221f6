package home

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/internal/logtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// peek is the tests' PeekUID: a token is "uid=<uid>" and anything else is
// malformed. The lane must not care what a token looks like.
func peek(token []byte) (string, error) {
	uid, ok := strings.CutPrefix(strings.TrimSpace(string(token)), "uid=")
	if !ok || uid == "" {
		return "", errors.New("not uid=<uid>")
	}
	return uid, nil
}

func newTestLane(t *testing.T, dir string, peekUID func([]byte) (string, error)) (*FileLane, *logtest.Recorder) {
	t.Helper()
	logs := &logtest.Recorder{}
	l, err := NewFileLane(FileLaneConfig{
		Dir:     dir,
		Clock:   clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0)),
		Logger:  logs.Logger(),
		PeekUID: peekUID,
	})
	if err != nil {
		t.Fatalf("NewFileLane: %v", err)
	}
	return l, logs
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// ev is an event as the tests compare it: kind, UID and base name.
type ev struct {
	Kind EventKind
	UID  string
	File string
}

func summarize(t *testing.T, dir string, events []GrantEvent) []ev {
	t.Helper()
	var out []ev
	for _, e := range events {
		if filepath.Dir(e.Path) != dir {
			t.Errorf("event %v: path %q is not in %q", e.Kind, e.Path, dir)
		}
		if e.Kind == GrantAdded {
			if uid, err := peek(e.Token); err != nil || uid != e.UID {
				t.Errorf("GrantAdded %q carries token %q", e.UID, e.Token)
			}
		} else if e.Token != nil {
			t.Errorf("GrantRemoved %q carries a token", e.UID)
		}
		out = append(out, ev{e.Kind, e.UID, filepath.Base(e.Path)})
	}
	return out
}

// pollNow runs one poll, failing the test if it does not return: a FIFO
// opened for reading would block it.
func pollNow(t *testing.T, l *FileLane) []GrantEvent {
	t.Helper()
	done := make(chan []GrantEvent, 1)
	go func() { done <- l.poll() }()
	select {
	case events := <-done:
		return events
	case <-time.After(30 * time.Second):
		t.Fatal("poll blocked")
		return nil
	}
}

func TestPollLifecycle(t *testing.T) {
	dir := t.TempDir()
	l, _ := newTestLane(t, dir, peek)
	a, b, d := filepath.Join(dir, "a.jwt"), filepath.Join(dir, "b.jwt"), filepath.Join(dir, "d.jwt")
	old := time.Unix(1_700_000_000, 0)

	steps := []struct {
		name   string
		change func(t *testing.T)
		want   []ev
	}{
		{"new files are added; other names are not read", func(t *testing.T) {
			write(t, a, "uid=a")
			write(t, b, "uid=b")
			write(t, filepath.Join(dir, "c.txt"), "uid=c")
			write(t, filepath.Join(dir, ".tmp.jwt"), "uid=tmp")
			write(t, filepath.Join(dir, "e.jwt.tmp"), "uid=e")
			if err := os.Chtimes(a, old, old); err != nil {
				t.Fatal(err)
			}
		}, []ev{{GrantAdded, "a", "a.jwt"}, {GrantAdded, "b", "b.jwt"}}},
		{"nothing changed", func(t *testing.T) {}, nil},
		{"size change", func(t *testing.T) {
			write(t, a, "uid=a\n")
			if err := os.Chtimes(a, old, old); err != nil {
				t.Fatal(err)
			}
		}, []ev{{GrantAdded, "a", "a.jwt"}}},
		{"mtime change", func(t *testing.T) {
			later := old.Add(time.Hour)
			if err := os.Chtimes(a, later, later); err != nil {
				t.Fatal(err)
			}
		}, []ev{{GrantAdded, "a", "a.jwt"}}},
		{"content change with the same size and mtime", func(t *testing.T) {
			write(t, a, "uid=A\n")
			later := old.Add(time.Hour)
			if err := os.Chtimes(a, later, later); err != nil {
				t.Fatal(err)
			}
		}, []ev{{GrantRemoved, "a", "a.jwt"}, {GrantAdded, "A", "a.jwt"}}},
		{"removed file", func(t *testing.T) {
			if err := os.Remove(b); err != nil {
				t.Fatal(err)
			}
		}, []ev{{GrantRemoved, "b", "b.jwt"}}},
		{"renamed file keeps its UID", func(t *testing.T) {
			if err := os.Rename(a, d); err != nil {
				t.Fatal(err)
			}
		}, []ev{{GrantAdded, "A", "d.jwt"}}},
		{"a second file with the same UID", func(t *testing.T) {
			write(t, a, "uid=A")
		}, []ev{{GrantAdded, "A", "a.jwt"}}},
		{"the UID stays while a file carries it", func(t *testing.T) {
			if err := os.Remove(d); err != nil {
				t.Fatal(err)
			}
		}, nil},
		{"the last file with the UID goes", func(t *testing.T) {
			if err := os.Remove(a); err != nil {
				t.Fatal(err)
			}
		}, []ev{{GrantRemoved, "A", "a.jwt"}}},
	}
	for _, s := range steps {
		s.change(t)
		if got := summarize(t, dir, pollNow(t, l)); !reflect.DeepEqual(got, s.want) {
			t.Fatalf("%s: events %v, want %v", s.name, got, s.want)
		}
	}
}

func TestPollSkipsWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	l, logs := newTestLane(t, dir, peek)
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.jwt"), 0o600); err != nil {
		t.Skipf("cannot make a FIFO: %v", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "dir.jwt"), 0o700); err != nil {
		t.Fatal(err)
	}
	sock, err := net.Listen("unix", filepath.Join(dir, "sock.jwt"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sock.Close() })
	if err := os.Symlink("/dev/null", filepath.Join(dir, "dev.jwt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "nowhere"), filepath.Join(dir, "dangling.jwt")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "ok.jwt"), "uid=ok")

	for i := range 3 {
		got := summarize(t, dir, pollNow(t, l))
		var want []ev
		if i == 0 {
			want = []ev{{GrantAdded, "ok", "ok.jwt"}}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("poll %d: events %v, want %v", i, got, want)
		}
	}
	for _, kind := range []string{"fifo.jwt", "dir.jwt", "sock.jwt", "dev.jwt"} {
		if n := logs.Count("Skipping", kind, "not a regular file"); n != 1 {
			t.Errorf("%s logged %d times over 3 polls, want once", kind, n)
		}
	}
}

func TestPollMalformedLoggedOnceThenFixed(t *testing.T) {
	dir := t.TempDir()
	var calls int
	counting := func(b []byte) (string, error) { calls++; return peek(b) }
	l, logs := newTestLane(t, dir, counting)
	bad := filepath.Join(dir, "bad.jwt")
	write(t, bad, "garbage")
	for i := range 3 {
		if got := pollNow(t, l); len(got) != 0 {
			t.Fatalf("poll %d: events %v for a malformed file", i, got)
		}
	}
	if n := logs.Count("Skipping", "bad.jwt", "malformed"); n != 1 {
		t.Errorf("malformed file logged %d times over 3 polls, want once", n)
	}
	if calls != 1 {
		t.Errorf("PeekUID called %d times for one unchanged copy, want 1", calls)
	}
	write(t, bad, "uid=fixed")
	if got, want := summarize(t, dir, pollNow(t, l)), []ev{{GrantAdded, "fixed", "bad.jwt"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("fixed file: events %v, want %v", got, want)
	}
	// Broken again: its grant is gone, and the new copy is logged.
	write(t, bad, "garbage again")
	if got, want := summarize(t, dir, pollNow(t, l)), []ev{{GrantRemoved, "fixed", "bad.jwt"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("broken file: events %v, want %v", got, want)
	}
	if n := logs.Count("Skipping", "bad.jwt", "malformed"); n != 2 {
		t.Errorf("malformed copies logged %d times, want 2", n)
	}
}

func TestPollTokenCap(t *testing.T) {
	dir := t.TempDir()
	var peeked []int
	counting := func(b []byte) (string, error) { peeked = append(peeked, len(b)); return "uid", nil }
	l, logs := newTestLane(t, dir, counting)
	write(t, filepath.Join(dir, "max.jwt"), strings.Repeat("x", MaxTokenSize))
	write(t, filepath.Join(dir, "big.jwt"), strings.Repeat("x", MaxTokenSize+1))
	for range 2 {
		pollNow(t, l)
	}
	if !reflect.DeepEqual(peeked, []int{MaxTokenSize}) {
		t.Errorf("PeekUID saw tokens of %v bytes, want only the one of %d", peeked, MaxTokenSize)
	}
	if n := logs.Count("Skipping", "big.jwt", "token cap"); n != 1 {
		t.Errorf("oversized file logged %d times over 2 polls, want once", n)
	}
}

func TestPollProjectedVolume(t *testing.T) {
	dir := t.TempDir()
	l, _ := newTestLane(t, dir, peek)

	// publish lays out a projected volume's generation as the kubelet
	// does: a timestamped directory, the ..data link swapped to it by a
	// rename, and per-file links through ..data.
	gen := 0
	publish := func(files map[string]string) {
		t.Helper()
		gen++
		ts := filepath.Join(dir, "..2026_12_02_10_00_0"+string(rune('0'+gen)))
		if err := os.Mkdir(ts, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, content := range files {
			write(t, filepath.Join(ts, name), content)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		for name := range files {
			link := filepath.Join(dir, name)
			if _, err := os.Lstat(link); err != nil {
				if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
					t.Fatal(err)
				}
			}
		}
	}

	publish(map[string]string{"grant.jwt": "uid=one", "other.txt": "x"})
	if got, want := summarize(t, dir, pollNow(t, l)), []ev{{GrantAdded, "one", "grant.jwt"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("first generation: events %v, want %v", got, want)
	}
	if got := pollNow(t, l); len(got) != 0 {
		t.Fatalf("unchanged volume: events %v", got)
	}
	publish(map[string]string{"grant.jwt": "uid=two"})
	if got, want := summarize(t, dir, pollNow(t, l)), []ev{{GrantRemoved, "one", "grant.jwt"}, {GrantAdded, "two", "grant.jwt"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("second generation: events %v, want %v", got, want)
	}
	// The grant leaves the volume: the link dangles until the kubelet
	// removes it, and either way the grant is gone.
	publish(map[string]string{})
	if got, want := summarize(t, dir, pollNow(t, l)), []ev{{GrantRemoved, "two", "grant.jwt"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("grant gone: events %v, want %v", got, want)
	}
}

func TestMissingDirectoryIsCreated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "grants")
	l, _ := newTestLane(t, dir, peek)
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatalf("NewFileLane did not create the directory: %v", err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("directory mode %v, want 0700", fi.Mode().Perm())
	}
	write(t, filepath.Join(dir, "a.jwt"), "uid=a")
	pollNow(t, l)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if got, want := summarize(t, dir, pollNow(t, l)), []ev{{GrantRemoved, "a", "a.jwt"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("directory gone: events %v, want %v", got, want)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("poll did not create the directory again with 0700: %v", err)
	}
}

func TestNewFileLaneRefusesAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "grants")
	write(t, path, "")
	if _, err := NewFileLane(FileLaneConfig{Dir: path, PeekUID: peek, Logger: logr.Discard()}); err == nil {
		t.Fatal("NewFileLane on a regular file succeeded")
	}
}

func TestFileLaneConfigValidate(t *testing.T) {
	tests := []struct {
		name  string
		cfg   FileLaneConfig
		field string
	}{
		{"ok", FileLaneConfig{Dir: "/x", PeekUID: peek}, ""},
		{"no dir", FileLaneConfig{PeekUID: peek}, "Dir"},
		{"negative poll", FileLaneConfig{Dir: "/x", Poll: -time.Second, PeekUID: peek}, "Poll"},
		{"no peek", FileLaneConfig{Dir: "/x"}, "PeekUID"},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if tt.field == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%s: Validate = %v, want an error naming %s", tt.name, err, tt.field)
		}
	}
	d := FileLaneConfig{}.withDefaults()
	if d.Poll != DefaultGrantsPoll || d.Clock == nil || d.Logger.GetSink() == nil {
		t.Errorf("defaults not filled: %+v", d)
	}
}

// recv waits for the next event; the timeout only keeps a broken lane from
// hanging the test.
func recv(t *testing.T, ch <-chan GrantEvent) GrantEvent {
	t.Helper()
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatal("lane channel closed")
		}
		return e
	case <-time.After(30 * time.Second):
		t.Fatal("no event from the lane")
		return GrantEvent{}
	}
}

func TestEvents(t *testing.T) {
	dir := t.TempDir()
	fc := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	l, err := NewFileLane(FileLaneConfig{Dir: dir, Poll: 5 * time.Second, Clock: fc, Logger: logr.Discard(), PeekUID: peek})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.jwt"), 0o600); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "a.jwt"), "uid=a")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := l.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Events(ctx); err == nil {
		t.Error("a second Events succeeded")
	}

	// The first poll runs at once, without a tick.
	if e := recv(t, ch); e.Kind != GrantAdded || e.UID != "a" {
		t.Fatalf("first event %v %q, want GrantAdded a", e.Kind, e.UID)
	}

	write(t, filepath.Join(dir, "b.jwt"), "uid=b")
	for !fc.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	fc.Step(5 * time.Second)
	if e := recv(t, ch); e.Kind != GrantAdded || e.UID != "b" {
		t.Fatalf("event after a tick %v %q, want GrantAdded b", e.Kind, e.UID)
	}

	cancel()
	for range ch {
	}
	l.Wait()
}

func TestEventsStopsMidSend(t *testing.T) {
	dir := t.TempDir()
	l, _ := newTestLane(t, dir, peek)
	write(t, filepath.Join(dir, "a.jwt"), "uid=a")
	write(t, filepath.Join(dir, "b.jwt"), "uid=b")
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := l.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	recv(t, ch) // the lane now waits to send b, and nobody reads
	cancel()
	l.Wait() // returns only because the send selects on ctx.Done
	if _, ok := <-ch; ok {
		// One event may have raced the cancel; the channel must close next.
		if _, ok := <-ch; ok {
			t.Fatal("channel still open after the lane stopped")
		}
	}
}

func TestWaitWithoutEvents(t *testing.T) {
	l, _ := newTestLane(t, t.TempDir(), peek)
	l.Wait() // must not block
}
