package backend

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

func goodManifest() manifest {
	return manifest{
		Version: manifestVersion, GrantUID: "g1", Epoch: 3, Seq: 7,
		Template: "counter@sha256:" + strings.Repeat("a", 64), SpecDigest: strings.Repeat("b", 64),
		PID: 1234, Comm: "counter", Network: "unix", Addr: "/run/f.sock", Inode: 99, Pipes: []uint64{5},
		Files: map[string]int64{"pages-1.img": 4096, "core-1234.img": 300}, OwnBytes: 4096, CRIU: "4.2.1",
	}
}

func TestParseManifest(t *testing.T) {
	b, _ := json.Marshal(goodManifest())
	m, err := parseManifest(b)
	if err != nil {
		t.Fatalf("parseManifest(good) = %v", err)
	}
	if m.bytes() != 4396 || m.fence() != (core.Fence{GrantUID: "g1", Epoch: 3, Seq: 7}) {
		t.Fatalf("parsed %+v", m)
	}
	for name, mutate := range map[string]func(*manifest){
		"version":      func(m *manifest) { m.Version = 2 },
		"no grant":     func(m *manifest) { m.GrantUID = "" },
		"slash grant":  func(m *manifest) { m.GrantUID = "a/b" },
		"no template":  func(m *manifest) { m.Template = "" },
		"short digest": func(m *manifest) { m.SpecDigest = "abc" },
		"pid":          func(m *manifest) { m.PID = 0 },
		"long comm":    func(m *manifest) { m.Comm = strings.Repeat("c", 16) },
		"network":      func(m *manifest) { m.Network = "udp" },
		"no addr":      func(m *manifest) { m.Addr = "" },
		"no inode":     func(m *manifest) { m.Inode = 0 },
		"pipes":        func(m *manifest) { m.Pipes = []uint64{1, 2, 3, 4} },
		"no files":     func(m *manifest) { m.Files = nil },
		"path file":    func(m *manifest) { m.Files = map[string]int64{"../x": 1} },
		"dot file":     func(m *manifest) { m.Files = map[string]int64{"..": 1} },
		"manifest":     func(m *manifest) { m.Files = map[string]int64{manifestName: 1} },
		"neg size":     func(m *manifest) { m.Files = map[string]int64{"a": -1} },
		"neg own":      func(m *manifest) { m.OwnBytes = -1 },
	} {
		m := goodManifest()
		mutate(&m)
		b, _ := json.Marshal(m)
		if _, err := parseManifest(b); !errors.Is(err, ErrImageUnusable) {
			t.Errorf("%s: parseManifest = %v, want ErrImageUnusable", name, err)
		}
	}
	for name, b := range map[string]string{
		"unknown member": `{"version":1,"what":1}`,
		"trailing":       string(b) + `{}`,
		"not json":       `version 1`,
		"huge":           `{"template":"` + strings.Repeat("x", maxManifestBytes) + `"}`,
	} {
		if _, err := parseManifest([]byte(b)); !errors.Is(err, ErrImageUnusable) {
			t.Errorf("%s: parseManifest = %v, want ErrImageUnusable", name, err)
		}
	}
}

func TestManifestUsableFor(t *testing.T) {
	m := goodManifest()
	req := ResumeRequest{Fence: core.Fence{GrantUID: "g1", Epoch: 3, Seq: 8}, Template: m.Template}
	if err := m.usableFor(req); err != nil {
		t.Fatalf("usableFor(newer fence) = %v", err)
	}
	for name, c := range map[string]struct {
		mutate func(*ResumeRequest)
		want   error
	}{
		"other grant": {func(r *ResumeRequest) { r.Fence.GrantUID = "g2" }, ErrImageUnusable},
		"newer epoch": {func(r *ResumeRequest) { r.Fence.Epoch = 4; r.Fence.Seq = 1 }, ErrImageUnusable},
		"older epoch": {func(r *ResumeRequest) { r.Fence.Epoch = 2 }, ErrImageUnusable},
		"template":    {func(r *ResumeRequest) { r.Template = "other@sha256:" + strings.Repeat("c", 64) }, ErrImageUnusable},
		"same fence":  {func(r *ResumeRequest) { r.Fence.Seq = 7 }, core.ErrInvalid},
		"older fence": {func(r *ResumeRequest) { r.Fence.Seq = 2 }, core.ErrInvalid},
	} {
		r := req
		c.mutate(&r)
		if err := m.usableFor(r); !errors.Is(err, c.want) {
			t.Errorf("%s: usableFor = %v, want %v", name, err, c.want)
		}
	}
}

func TestSpecDigest(t *testing.T) {
	a := template.Spec{Command: "/bin/x", Args: []string{"-a"}, Env: map[string]string{"B": "1", "A": "2"}, Zygote: true}
	b := template.Spec{Command: "/bin/x", Args: []string{"-a"}, Env: map[string]string{"A": "2", "B": "1"}, Zygote: true}
	if specDigest(a) != specDigest(b) || len(specDigest(a)) != 64 {
		t.Fatalf("equal specs digest differently: %s %s", specDigest(a), specDigest(b))
	}
	b.Args = []string{"-b"}
	if specDigest(a) == specDigest(b) {
		t.Fatal("different specs digest the same")
	}
}

func TestCheckRequests(t *testing.T) {
	f := core.Fence{GrantUID: "g", Epoch: 1, Seq: 1}
	tpl := "t@sha256:" + strings.Repeat("0", 64)
	for _, req := range []ParkRequest{
		{Dir: "/x", Template: tpl},
		{Fence: f, Dir: "x", Template: tpl},
		{Fence: f, Dir: "/x/../y", Template: tpl},
		{Fence: f, Dir: "/x"},
		{Fence: f, Dir: "/x", Template: tpl, MaxBytes: -1},
	} {
		if err := req.Validate(); !errors.Is(err, core.ErrInvalid) {
			t.Errorf("ParkRequest.Validate(%+v) = %v, want ErrInvalid", req, err)
		}
	}
	for _, req := range []ResumeRequest{
		{Image: "/x", Template: tpl},
		{Fence: f, Image: "x", Template: tpl},
		{Fence: f, Image: "/x"},
		{Fence: f, Image: "/x", Template: tpl, Leaf: "leaf"},
	} {
		if err := req.Validate(); !errors.Is(err, core.ErrInvalid) {
			t.Errorf("ResumeRequest.Validate(%+v) = %v, want ErrInvalid", req, err)
		}
	}
	if err := RemoveImage("relative"); !errors.Is(err, core.ErrInvalid) {
		t.Errorf("RemoveImage(relative) = %v, want ErrInvalid", err)
	}
}

// FuzzParseManifest: the manifest is read from disk at resume; no input
// panics, and whatever parses re-encodes to something that parses the same.
func FuzzParseManifest(f *testing.F) {
	b, _ := json.Marshal(goodManifest())
	f.Add(b)
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"files":{"..":1}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseManifest(b)
		if err != nil {
			if !errors.Is(err, ErrImageUnusable) {
				t.Fatalf("error %v does not wrap ErrImageUnusable", err)
			}
			return
		}
		again, _ := json.Marshal(m)
		if _, err := parseManifest(again); err != nil {
			t.Fatalf("re-encoded manifest refused: %v", err)
		}
	})
}
