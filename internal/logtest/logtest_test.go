package logtest_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"fiberd.io/fiberd/internal/logtest"
)

func TestRecorder(t *testing.T) {
	var r logtest.Recorder
	log := r.Logger()
	log.Info("skipping", "file", "a.jwt")
	log.WithName("lane").Error(errors.New("malformed"), "skipping", "file", "b.jwt")
	log.V(1).Info("verbose detail")

	if got := r.Lines(); len(got) != 2 {
		t.Fatalf("lines %q, want 2 (the V(1) line dropped)", got)
	}
	if !strings.HasPrefix(r.Lines()[1], "lane ") {
		t.Errorf("named line %q does not start with its name", r.Lines()[1])
	}
	for _, tt := range []struct {
		subs []string
		want int
	}{
		{[]string{"skipping"}, 2},
		{[]string{"skipping", "b.jwt", "malformed"}, 1},
		{[]string{"skipping", "c.jwt"}, 0},
		{nil, 2},
	} {
		if n := r.Count(tt.subs...); n != tt.want {
			t.Errorf("Count(%q) = %d, want %d; lines %q", tt.subs, n, tt.want, r.Lines())
		}
	}
	if m := r.Matching("a.jwt"); len(m) != 1 || !strings.Contains(m[0], `"file"="a.jwt"`) {
		t.Errorf("Matching(a.jwt) = %q", m)
	}
	if s := r.String(); strings.Count(s, "\n") != 1 || strings.Contains(s, "verbose") {
		t.Errorf("String() = %q", s)
	}
}

func TestRecorderVerbosity(t *testing.T) {
	r := logtest.Recorder{Verbosity: 1}
	log := r.Logger()
	log.V(1).Info("one")
	log.V(2).Info("two")
	if r.Count("one") != 1 || r.Count("two") != 0 {
		t.Errorf("Verbosity 1 recorded %q, want the V(1) line only", r.Lines())
	}
}

func TestRecorderConcurrent(t *testing.T) {
	var r logtest.Recorder
	log := r.Logger()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				log.Info("line")
				_ = r.Count("line")
			}
		})
	}
	wg.Wait()
	if n := r.Count("line"); n != 400 {
		t.Errorf("recorded %d lines, want 400", n)
	}
}
