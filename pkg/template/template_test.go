package template

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"fiberd.io/fiberd/pkg/core"
)

const goodSpec = `{"command":"/usr/bin/python3","args":["-u","/opt/counter.py"],"env":{"B":"2","A":"1"},"workdir":"/opt","zygote":true}`

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string
	}{
		{name: "full", in: goodSpec},
		{name: "minimal bare name", in: `{"command":"python3"}`},
		{name: "empty command", in: `{"command":""}`, wantErr: "command is empty"},
		{name: "relative path", in: `{"command":"bin/x"}`, wantErr: "relative path"},
		{name: "relative workdir", in: `{"command":"/x","workdir":"opt"}`, wantErr: "workdir"},
		{name: "unknown member", in: `{"command":"/x","image":"y"}`, wantErr: "unknown field"},
		{name: "trailing data", in: `{"command":"/x"} {}`, wantErr: "after the JSON"},
		{name: "env key with =", in: `{"command":"/x","env":{"A=B":"c"}}`, wantErr: "env key"},
		{name: "NUL in arg", in: `{"command":"/x","args":["a\u0000b"]}`, wantErr: "NUL"},
		{name: "not an object", in: `[]`, wantErr: "cannot unmarshal"},
		{name: "isolation shared, network none", in: `{"command":"/x","isolation":"shared","network":"none"}`},
		{name: "unknown isolation", in: `{"command":"/x","isolation":"fiber"}`, wantErr: "isolation"},
		{name: "unknown network", in: `{"command":"/x","network":"host"}`, wantErr: "network"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse([]byte(tt.in))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if s.Command == "" {
					t.Fatal("command lost")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, core.ErrInvalid) {
				t.Fatalf("Parse error = %v, want one containing %q wrapping ErrInvalid", err, tt.wantErr)
			}
		})
	}
}

func TestEnvListSorted(t *testing.T) {
	s, err := Parse([]byte(goodSpec))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.EnvList(), ","); got != "A=1,B=2" {
		t.Fatalf("EnvList = %q, want A=1,B=2", got)
	}
}

func TestParseRef(t *testing.T) {
	hex := strings.Repeat("ab", 32)
	tests := []struct {
		in string
		ok bool
	}{
		{"counter@sha256:" + hex, true},
		{"counter-c@sha256:" + hex, true},
		{"Counter@sha256:" + hex, false},
		{"counter@sha256:" + strings.ToUpper(hex), false},
		{"counter@sha256:" + hex[:62], false},
		{"counter:" + hex, false},
		{"@sha256:" + hex, false},
		{"a/b@sha256:" + hex, false},
		{"../x@sha256:" + hex, false},
	}
	for _, tt := range tests {
		r, err := ParseRef(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("ParseRef(%q) error = %v, want ok=%v", tt.in, err, tt.ok)
			continue
		}
		if tt.ok && r.String() != tt.in {
			t.Errorf("String() = %q, want %q", r.String(), tt.in)
		}
		if !tt.ok && !errors.Is(err, core.ErrInvalid) {
			t.Errorf("ParseRef(%q) error %v does not wrap ErrInvalid", tt.in, err)
		}
	}
}

func TestResolve(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "counter.json"), []byte(goodSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "broken.json"), []byte(`{"command":""}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.json"), 0o644); err != nil {
		t.Fatal(err)
	}
	good := Digest([]byte(goodSpec))
	other := strings.Repeat("0", 64)
	d := Dir(dir)

	t.Run("match", func(t *testing.T) {
		s, err := d.Resolve("counter@sha256:" + good)
		if err != nil {
			t.Fatalf("Resolve: %v", err)
		}
		if !s.Zygote || s.Command != "/usr/bin/python3" {
			t.Fatalf("spec = %+v", s)
		}
	})
	t.Run("mismatch names both digests", func(t *testing.T) {
		_, err := d.Resolve("counter@sha256:" + other)
		if !errors.Is(err, ErrDigestMismatch) || !errors.Is(err, core.ErrInvalid) {
			t.Fatalf("error = %v, want ErrDigestMismatch", err)
		}
		if !strings.Contains(err.Error(), good) || !strings.Contains(err.Error(), other) {
			t.Fatalf("error %q does not name both digests", err)
		}
	})
	t.Run("missing", func(t *testing.T) {
		_, err := d.Resolve("nothere@sha256:" + other)
		if !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, core.ErrInvalid) || !strings.Contains(err.Error(), other) {
			t.Fatalf("error = %v, want not-exist naming the digest", err)
		}
	})
	t.Run("malformed spec", func(t *testing.T) {
		b, _ := os.ReadFile(filepath.Join(dir, "broken.json"))
		_, err := d.Resolve("broken@sha256:" + Digest(b))
		if err == nil || !strings.Contains(err.Error(), "command is empty") {
			t.Fatalf("error = %v", err)
		}
	})
	t.Run("fifo is not opened", func(t *testing.T) {
		_, err := d.Resolve("fifo@sha256:" + other)
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("error = %v", err)
		}
	})
	t.Run("bad ref", func(t *testing.T) {
		if _, err := d.Resolve("counter"); !errors.Is(err, core.ErrInvalid) {
			t.Fatalf("error = %v", err)
		}
	})
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(goodSpec))
	f.Add([]byte(`{"command":"x","env":{"":""}}`))
	f.Add([]byte(`{"command":"/x","args":[1]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Parse(b)
		if err == nil {
			if verr := s.Validate(); verr != nil {
				t.Fatalf("Parse accepted a spec Validate refuses: %v", verr)
			}
		}
	})
}

func FuzzParseRef(f *testing.F) {
	f.Add("counter@sha256:" + strings.Repeat("ab", 32))
	f.Add("x@sha256:")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRef(s)
		if err == nil && r.String() != s {
			t.Fatalf("round trip %q -> %q", s, r.String())
		}
		if err == nil && strings.ContainsAny(r.Name, "/.") {
			t.Fatalf("name %q could escape the directory", r.Name)
		}
	})
}

// TestExampleSpecs keeps the shipped example specs valid.
func TestExampleSpecs(t *testing.T) {
	paths, err := filepath.Glob("../../examples/templates/*.json")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no example specs found: %v", err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(filepath.Base(p), ".json")
		if _, err := Dir(filepath.Dir(p)).Resolve(name + "@sha256:" + Digest(b)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}
