package cgroup

import (
	"errors"
	"strings"
	"testing"
)

// Lines as the kernel writes them; the cgroup2 lines are from a hybrid host
// and from a Pod.
const (
	mountHybrid = `23 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
`
	mountPod = `1530 1529 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime master:10 master:11 - cgroup2 cgroup ro,nsdelegate,memory_recursiveprot
`
)

func TestParseMountInfo(t *testing.T) {
	tests := []struct {
		name        string
		in          string
		point, root string
		unsupported bool
	}{
		{name: "hybrid host", in: mountHybrid, point: "/sys/fs/cgroup/unified", root: "/"},
		{name: "pod, two optional fields", in: mountPod, point: "/sys/fs/cgroup", root: "/"},
		{name: "no optional fields", in: "41 31 0:38 / /cg rw - cgroup2 cgroup2 rw\n", point: "/cg", root: "/"},
		{name: "escaped space and backslash", in: `41 31 0:38 /a\040b /mnt/my\040cg\134x rw - cgroup2 none rw` + "\n", point: `/mnt/my cg\x`, root: "/a b"},
		{name: "bind-mounted subtree", in: "41 31 0:38 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", point: "/sys/fs/cgroup", root: "/kubepods/pod1"},
		{name: "first of two", in: "1 0 0:1 / /a rw - cgroup2 x rw\n2 0 0:1 / /b rw - cgroup2 x rw\n", point: "/a", root: "/"},
		{name: "no final newline", in: "41 31 0:38 / /cg rw - cgroup2 cgroup2 rw", point: "/cg", root: "/"},
		{name: "v1 only", in: "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", unsupported: true},
		{name: "cgroup2 as an option, not fstype", in: "1 0 0:1 / /x rw cgroup2 - tmpfs tmpfs rw\n", unsupported: true},
		{name: "separator missing", in: "41 31 0:38 / /cg rw cgroup2 cgroup2 rw\n", unsupported: true},
		{name: "relative mount point", in: "41 31 0:38 / cg rw - cgroup2 cgroup2 rw\n", unsupported: true},
		{name: "truncated", in: "41 31 0:38 / /cg - cgroup2\n", unsupported: true},
		{name: "empty", in: "", unsupported: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			point, root, err := ParseMountInfo(strings.NewReader(tt.in))
			if tt.unsupported {
				if !errors.Is(err, errors.ErrUnsupported) {
					t.Fatalf("got (%q, %q, %v), want an ErrUnsupported error", point, root, err)
				}
				return
			}
			if err != nil || point != tt.point || root != tt.root {
				t.Fatalf("got (%q, %q, %v), want (%q, %q, nil)", point, root, err, tt.point, tt.root)
			}
		})
	}
}

func TestParseMountInfoLongLine(t *testing.T) {
	in := strings.Repeat("x", maxLine+1) + "\n41 31 0:38 / /cg rw - cgroup2 cgroup2 rw\n"
	if _, _, err := ParseMountInfo(strings.NewReader(in)); err == nil || errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("over-long line: got %v, want a read error", err)
	}
}

func TestParseProcCgroup(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string
		wantErr bool
		unsupp  bool
	}{
		{name: "v2 only, root", in: "0::/\n", want: "/"},
		{name: "v2 only, pod", in: "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope\n", want: "/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope"},
		{name: "hybrid", in: "9:name=systemd:/\n4:memory:/process_api/37ddb\n1:cpu:/\n0::/user.slice/a b\n", want: "/user.slice/a b"},
		{name: "path with colon", in: "0::/a:b\n", want: "/a:b"},
		{name: "deleted cgroup", in: "0::/gone (deleted)\n", want: "/gone"},
		{name: "v1 only", in: "4:memory:/x\n1:cpu:/\n", unsupp: true},
		{name: "empty", in: "", unsupp: true},
		{name: "named v1 at id 0 is not v2", in: "0:name=foo:/x\n", unsupp: true},
		{name: "outside the namespace", in: "0::/../../x\n", wantErr: true},
		{name: "relative", in: "0::x\n", wantErr: true},
		{name: "not clean", in: "0::/a//b\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseProcCgroup(strings.NewReader(tt.in))
			switch {
			case tt.unsupp:
				if !errors.Is(err, errors.ErrUnsupported) {
					t.Fatalf("got (%q, %v), want an ErrUnsupported error", got, err)
				}
			case tt.wantErr:
				if err == nil || errors.Is(err, errors.ErrUnsupported) {
					t.Fatalf("got (%q, %v), want a path error", got, err)
				}
			case err != nil || got != tt.want:
				t.Fatalf("got (%q, %v), want (%q, nil)", got, err, tt.want)
			}
		})
	}
}

func TestSelfDir(t *testing.T) {
	tests := []struct {
		point, root, path string
		want              string
		wantErr           bool
	}{
		{point: "/sys/fs/cgroup/unified", root: "/", path: "/", want: "/sys/fs/cgroup/unified"},
		{point: "/sys/fs/cgroup", root: "/", path: "/pod/c1", want: "/sys/fs/cgroup/pod/c1"},
		{point: "/sys/fs/cgroup", root: "/pod", path: "/pod", want: "/sys/fs/cgroup"},
		{point: "/sys/fs/cgroup", root: "/pod", path: "/pod/c1", want: "/sys/fs/cgroup/c1"},
		{point: "/sys/fs/cgroup", root: "/pod", path: "/podx/c1", wantErr: true},
		{point: "/sys/fs/cgroup", root: "/pod", path: "/", wantErr: true},
	}
	for _, tt := range tests {
		got, err := selfDir(tt.point, tt.root, tt.path)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("selfDir(%q, %q, %q) = (%q, %v), want (%q, err=%v)", tt.point, tt.root, tt.path, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParsePressure(t *testing.T) {
	tests := []struct {
		in      string
		want    float64
		wantErr bool
	}{
		{in: "some avg10=1.25 avg60=0.50 avg300=0.10 total=12345\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", want: 1.25},
		{in: "full avg10=9.00 avg60=0 avg300=0 total=0\nsome avg10=3.00 avg60=0 avg300=0 total=0\n", want: 3},
		{in: "some avg10=0.00 avg60=0.00 avg300=0.00 total=0", want: 0},
		{in: "full avg10=1.00\n", wantErr: true},
		{in: "some avg10=abc\n", wantErr: true},
		{in: "some avg10=-1\n", wantErr: true},
		{in: "some avg10=NaN\n", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parsePressure([]byte(tt.in))
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parsePressure(%q) = (%v, %v), want (%v, err=%v)", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestEventValue(t *testing.T) {
	data := []byte("populated 1\nfrozen 0\n")
	if v, ok := eventValue(data, "populated"); !ok || v != "1" {
		t.Errorf("populated = %q, %v; want 1", v, ok)
	}
	if v, ok := eventValue(data, "frozen"); !ok || v != "0" {
		t.Errorf("frozen = %q, %v; want 0", v, ok)
	}
	if _, ok := eventValue(data, "pop"); ok {
		t.Errorf("prefix key matched")
	}
}

func TestParseProcs(t *testing.T) {
	if got, err := parseProcs([]byte("1\n42\n")); err != nil || len(got) != 2 || got[0] != 1 || got[1] != 42 {
		t.Errorf("parseProcs = %v, %v; want [1 42]", got, err)
	}
	if got, err := parseProcs(nil); err != nil || len(got) != 0 {
		t.Errorf("parseProcs(empty) = %v, %v; want []", got, err)
	}
	if _, err := parseProcs([]byte("1\nx\n")); err == nil {
		t.Errorf("parseProcs accepted a non-number")
	}
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"0c4f7e1a-uid", "grant.1", "zygote"} {
		if err := checkName(ok); err != nil {
			t.Errorf("checkName(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "a\x00", "a\nb", "cgroup.procs"} {
		if err := checkName(bad); err == nil {
			t.Errorf("checkName(%q) = nil, want an error", bad)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		cfg   Config
		field string // "" means valid
	}{
		{cfg: Config{Root: "/sys/fs/cgroup/grants"}},
		{cfg: Config{}, field: "Root"},
		{cfg: Config{Root: "sys/fs/cgroup"}, field: "Root"},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if tt.field == "" {
			if err != nil {
				t.Errorf("Validate(%+v) = %v, want nil", tt.cfg, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "Config."+tt.field) {
			t.Errorf("Validate(%+v) = %v, want an error naming Config.%s", tt.cfg, err, tt.field)
		}
	}
}

func FuzzParseMountInfo(f *testing.F) {
	f.Add(mountHybrid)
	f.Add(mountPod)
	f.Add(`41 31 0:38 /a\040b /mnt/my\040cg rw - cgroup2 none rw`)
	f.Add("1 0 0:1 / /x rw - cgroup2")
	f.Add(`1 0 0:1 \ \777 rw - cgroup2 x rw`)
	f.Fuzz(func(t *testing.T, in string) {
		point, root, err := ParseMountInfo(strings.NewReader(in))
		if err != nil {
			return
		}
		if !strings.HasPrefix(point, "/") || !strings.HasPrefix(root, "/") {
			t.Fatalf("ParseMountInfo(%q) = (%q, %q): not absolute", in, point, root)
		}
	})
}

func FuzzParseProcCgroup(f *testing.F) {
	f.Add("0::/\n")
	f.Add("9:name=systemd:/\n4:memory:/x\n0::/user.slice/a b\n")
	f.Add("0::/../x\n")
	f.Add("0::/gone (deleted)\n")
	f.Fuzz(func(t *testing.T, in string) {
		p, err := ParseProcCgroup(strings.NewReader(in))
		if err != nil {
			return
		}
		if !strings.HasPrefix(p, "/") || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
			t.Fatalf("ParseProcCgroup(%q) = %q: escapes the hierarchy", in, p)
		}
		// Whatever mount it is joined to, the result stays under it.
		dir, err := selfDir("/sys/fs/cgroup", "/", p)
		if err != nil || (dir != "/sys/fs/cgroup" && !strings.HasPrefix(dir, "/sys/fs/cgroup/")) {
			t.Fatalf("selfDir(%q) = (%q, %v): escapes the mount", p, dir, err)
		}
	})
}

func FuzzParsePressure(f *testing.F) {
	f.Add("some avg10=1.25 avg60=0.50 avg300=0.10 total=12345\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
	f.Add("some avg10=")
	f.Fuzz(func(t *testing.T, in string) {
		v, err := parsePressure([]byte(in))
		if err == nil && (v < 0 || v > 100) {
			t.Fatalf("parsePressure(%q) = %v: outside 0..100", in, v)
		}
	})
}
