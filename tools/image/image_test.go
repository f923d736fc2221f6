package image_test

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"fiberd.io/fiberd/tools/image"
)

func spec() image.Spec {
	return image.Spec{
		Ref:        "fiberd.local/test:dev",
		Base:       true,
		Entrypoint: []string{"/usr/local/bin/app", "-v"},
		User:       "65532:65532",
		Files: []image.File{
			{Path: "/usr/local/bin/app", Mode: 0o755, Data: []byte("\x7fELF not really")},
			{Path: "/etc/app/config.json", Data: []byte(`{"a":1}`)},
			{Path: "/usr/local/bin/app-caps", Mode: 0o755, Data: []byte("\x7fELF"), Caps: 1<<21 | 1<<7 | 1<<6},
		},
		Dirs: []image.Dir{{Path: "/var/lib/app", Mode: 0o700, UID: 65532, GID: 65532}},
	}
}

// entries reads a layer back: name to header.
func entries(t *testing.T, layer []byte) ([]string, map[string]*tar.Header, map[string]string) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(layer))
	var names []string
	hdrs := map[string]*tar.Header{}
	data := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		names = append(names, h.Name)
		hdrs[h.Name] = h
		data[h.Name] = string(b)
	}
	return names, hdrs, data
}

// The layer holds every file and its parents, root-owned unless said
// otherwise, dated at the epoch, each directory before what it holds.
func TestLayer(t *testing.T) {
	layer, err := image.Layer(spec())
	if err != nil {
		t.Fatal(err)
	}
	names, hdrs, data := entries(t, layer)
	for _, want := range []string{"usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/app", "etc/app/config.json", "tmp/", "etc/passwd", "var/lib/app/"} {
		if hdrs[want] == nil {
			t.Errorf("layer lacks %s; has %q", want, names)
		}
	}
	seen := map[string]bool{}
	for _, n := range names {
		if parent := filepath.Dir(strings.TrimSuffix(n, "/")); parent != "." && !seen[parent+"/"] {
			t.Errorf("%s comes before its directory %s/", n, parent)
		}
		seen[n] = true
		h := hdrs[n]
		if h.ModTime.Unix() != 0 {
			t.Errorf("%s dated %v, want the epoch", n, h.ModTime)
		}
	}
	if h := hdrs["usr/local/bin/app"]; h.Mode != 0o755 || h.Uid != 0 || data[h.Name] != "\x7fELF not really" {
		t.Errorf("app: mode %o uid %d data %q", h.Mode, h.Uid, data[h.Name])
	}
	if h := hdrs["etc/app/config.json"]; h.Mode != 0o644 {
		t.Errorf("config.json mode %o, want the default 0644", h.Mode)
	}
	if h := hdrs["tmp/"]; h.Mode != 0o1777 {
		t.Errorf("/tmp mode %o, want 1777", h.Mode)
	}
	if h := hdrs["var/lib/app/"]; h.Mode != 0o700 || h.Uid != image.NonRoot || h.Gid != image.NonRoot {
		t.Errorf("/var/lib/app: mode %o owner %d:%d", h.Mode, h.Uid, h.Gid)
	}
	// What setcap cap_setgid,cap_setuid,cap_sys_admin=ep writes: revision 2 with the effective
	// flag, then the permitted and inheritable words, low then high.
	const wantCaps = "\x01\x00\x00\x02" + "\xc0\x00\x20\x00" + "\x00\x00\x00\x00" + "\x00\x00\x00\x00" + "\x00\x00\x00\x00"
	if got := hdrs["usr/local/bin/app-caps"].PAXRecords["SCHILY.xattr.security.capability"]; got != wantCaps {
		t.Errorf("app-caps: security.capability %q, want %q", got, wantCaps)
	}
	if _, ok := hdrs["usr/local/bin/app"].PAXRecords["SCHILY.xattr.security.capability"]; ok {
		t.Errorf("app has file capabilities, want none")
	}
	if !strings.Contains(data["etc/passwd"], "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd lacks nonroot: %q", data["etc/passwd"])
	}
}

// The same spec gives the same image digest, written twice to files at
// different times; a changed byte gives another.
func TestReproducible(t *testing.T) {
	dir := t.TempDir()
	a, err := image.WriteFile(filepath.Join(dir, "a.tar"), spec())
	if err != nil {
		t.Fatal(err)
	}
	b, err := image.WriteFile(filepath.Join(dir, "b.tar"), spec())
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("digests %s and %s of one spec", a, b)
	}
	ba, _ := os.ReadFile(filepath.Join(dir, "a.tar"))
	bb, _ := os.ReadFile(filepath.Join(dir, "b.tar"))
	if !bytes.Equal(ba, bb) {
		t.Fatal("the two tarballs differ byte for byte")
	}
	s := spec()
	s.Files[0].Data = []byte("\x7fELF changed")
	c, err := image.WriteFile(filepath.Join(dir, "c.tar"), s)
	if err != nil {
		t.Fatal(err)
	}
	if c == a {
		t.Fatal("a changed file kept the digest")
	}
}

// The tarball reads back as the image: its tag, configuration and layer.
func TestWriteFileReadsBack(t *testing.T) {
	file := filepath.Join(t.TempDir(), "img.tar")
	d, err := image.WriteFile(file, spec())
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("fiberd.local/test:dev")
	img, err := tarball.ImageFromPath(file, &tag)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := img.Digest(); got != d {
		t.Errorf("digest read back %s, WriteFile said %s", got, d)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Config.User != "65532:65532" || strings.Join(cf.Config.Entrypoint, " ") != "/usr/local/bin/app -v" ||
		cf.Config.WorkingDir != "/" || len(cf.Config.Env) != 1 || cf.Created.Unix() != 0 {
		t.Errorf("config %+v", cf.Config)
	}
	layers, _ := img.Layers()
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
}

func TestRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*image.Spec)
		want string
	}{
		{"relative path", func(s *image.Spec) { s.Files[0].Path = "usr/bin/app" }, "absolute"},
		{"unclean path", func(s *image.Spec) { s.Files[0].Path = "/usr/../bin/app" }, "clean"},
		{"file twice", func(s *image.Spec) { s.Files = append(s.Files, s.Files[0]) }, "twice"},
		{"file under a file", func(s *image.Spec) {
			s.Files = append(s.Files, image.File{Path: "/usr/local/bin/app/x"})
		}, "is a file"},
		{"no ref", func(s *image.Spec) { s.Ref = "" }, "Ref"},
		{"digest ref", func(s *image.Spec) { s.Ref = "fiberd.local/x@sha256:" + strings.Repeat("0", 64) }, "Ref"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec()
			tc.edit(&s)
			_, err := image.WriteFile(filepath.Join(t.TempDir(), "x.tar"), s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// A file of the spec replaces the base one of the same path.
func TestBaseReplaced(t *testing.T) {
	s := spec()
	s.Files = append(s.Files, image.File{Path: "/etc/passwd", Data: []byte("root:x:0:0::/:/x\n")})
	layer, err := image.Layer(s)
	if err != nil {
		t.Fatal(err)
	}
	_, _, data := entries(t, layer)
	if data["etc/passwd"] != "root:x:0:0::/:/x\n" {
		t.Errorf("/etc/passwd %q, want the spec's", data["etc/passwd"])
	}
}
