package image

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// NonRoot is the user and group id the base layout names "nonroot", the id
// images built here run as unless a Pod says otherwise.
const NonRoot = 65532

// epoch is every entry's modification time and the image's creation time,
// so that the same inputs give the same bytes.
var epoch = time.Unix(0, 0).UTC()

// File is one regular file of the image.
type File struct {
	// Path is the absolute path in the image, e.g. /usr/local/bin/fiberd.
	// Required; its parent directories are created (mode 0755) when no Dir
	// names them.
	Path string
	// Mode is the permission bits. Zero means 0644.
	Mode fs.FileMode
	// Data is the file's content.
	Data []byte
	// Caps are file capabilities, a bit per capability number (1<<21 is
	// CAP_SYS_ADMIN), set permitted and effective: an execve of the file
	// gives them to its process, as far as the process's bounding set and
	// no_new_privs allow. Written as the security.capability extended
	// attribute, revision 2 (no root id: the user namespace owning the
	// mount decides whose root the file's owner is). Zero means none.
	Caps uint64
}

// capXattr is the security.capability value of caps, revision 2, with the
// effective flag: what setcap CAPS=ep writes.
func capXattr(caps uint64) string {
	const revision2, effective = 0x02000000, 0x000001
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], revision2|effective)
	binary.LittleEndian.PutUint32(b[4:], uint32(caps))      // permitted, low word
	binary.LittleEndian.PutUint32(b[12:], uint32(caps>>32)) // permitted, high word
	return string(b)
}

// Dir is one directory of the image.
type Dir struct {
	// Path is the absolute path in the image. Required.
	Path string
	// Mode is the permission bits, sticky bit included (os.ModeSticky).
	// Zero means 0755.
	Mode fs.FileMode
	// UID and GID own the directory. Default 0.
	UID, GID int
}

// Spec is a one-layer image.
type Spec struct {
	// Ref is the image reference the tarball carries, e.g.
	// fiberd.local/fiberd:dev. Required; a tag, never a digest.
	Ref string
	// Files are the regular files. Two with one path are an error.
	Files []File
	// Dirs are directories beyond the parents Files imply.
	Dirs []Dir
	// Base adds the layout every image here starts from (BaseDirs and
	// BaseFiles: /etc/passwd and /etc/group naming root and nonroot, /tmp
	// world-writable and sticky, the mount points a runtime expects).
	// A File or Dir of the same path replaces the base one.
	Base bool
	// Entrypoint and Cmd are the image's ENTRYPOINT and CMD. Empty means none.
	Entrypoint, Cmd []string
	// Env is the image's environment, KEY=VALUE each. Empty means PATH only
	// (PATH=/usr/local/bin:/usr/bin:/bin).
	Env []string
	// WorkingDir is the image's working directory. Empty means /.
	WorkingDir string
	// User is the image's USER, "uid[:gid]". Empty means root.
	User string
	// Labels are the image's labels.
	Labels map[string]string
	// Arch is the image's architecture. Empty means the architecture this
	// program was built for (runtime.GOARCH), which is the binaries' when
	// they are built on the same machine.
	Arch string
}

// BaseDirs are the directories of the base layout.
func BaseDirs() []Dir {
	return []Dir{
		{Path: "/dev"}, {Path: "/etc"}, {Path: "/proc"}, {Path: "/sys"}, {Path: "/run"},
		{Path: "/tmp", Mode: 0o777 | os.ModeSticky},
		{Path: "/var"}, {Path: "/var/run"},
		{Path: "/home/nonroot", Mode: 0o700, UID: NonRoot, GID: NonRoot},
	}
}

// BaseFiles are the files of the base layout.
func BaseFiles() []File {
	return []File{
		{Path: "/etc/passwd", Data: []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRoot, NonRoot))},
		{Path: "/etc/group", Data: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", NonRoot))},
	}
}

// entry is one tar entry of the layer.
type entry struct {
	hdr  tar.Header
	data []byte
}

// Layer returns the image's one layer as an uncompressed tar: every
// directory and file, sorted by path, owned by root unless a Dir says
// otherwise, every time the Unix epoch. The same spec gives the same bytes.
// It fails on a relative or unclean path, a path the spec gives twice, or
// a file where a directory must be.
func Layer(s Spec) ([]byte, error) {
	clean := func(p string) error {
		if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
			return fmt.Errorf("image %s: path %q must be absolute and clean, and not /", s.Ref, p)
		}
		return nil
	}
	dirs := map[string]Dir{}
	files := map[string]File{}
	if s.Base {
		for _, d := range BaseDirs() {
			dirs[d.Path] = d
		}
		for _, f := range BaseFiles() {
			files[f.Path] = f
		}
	}
	// The spec's own entries replace base ones of the same path, never
	// each other.
	seen := map[string]bool{}
	for _, d := range s.Dirs {
		if err := clean(d.Path); err != nil {
			return nil, err
		}
		if seen[d.Path] {
			return nil, fmt.Errorf("image %s: %s given twice", s.Ref, d.Path)
		}
		seen[d.Path] = true
		delete(files, d.Path)
		dirs[d.Path] = d
	}
	for _, f := range s.Files {
		if err := clean(f.Path); err != nil {
			return nil, err
		}
		if seen[f.Path] {
			return nil, fmt.Errorf("image %s: %s given twice", s.Ref, f.Path)
		}
		seen[f.Path] = true
		delete(dirs, f.Path)
		files[f.Path] = f
	}
	for p := range files {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := files[d]; ok {
				return nil, fmt.Errorf("image %s: %s is a file, yet %s lies under it", s.Ref, d, p)
			}
			if _, ok := dirs[d]; !ok {
				dirs[d] = Dir{Path: d}
			}
		}
	}
	for p := range dirs {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := files[d]; ok {
				return nil, fmt.Errorf("image %s: %s is a file, yet %s lies under it", s.Ref, d, p)
			}
			if _, ok := dirs[d]; !ok {
				dirs[d] = Dir{Path: d}
			}
		}
	}

	var entries []entry
	for p, d := range dirs {
		mode := d.Mode
		if mode == 0 {
			mode = 0o755
		}
		entries = append(entries, entry{hdr: tar.Header{
			Typeflag: tar.TypeDir, Name: strings.TrimPrefix(p, "/") + "/",
			Mode: tarMode(mode), Uid: d.UID, Gid: d.GID, ModTime: epoch, Format: tar.FormatPAX,
		}})
	}
	for p, f := range files {
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		hdr := tar.Header{
			Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"),
			Mode: tarMode(mode), Size: int64(len(f.Data)), ModTime: epoch, Format: tar.FormatPAX,
		}
		if f.Caps != 0 {
			hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": capXattr(f.Caps)}
		}
		entries = append(entries, entry{hdr: hdr, data: f.Data})
	}
	// Parents before their children, whatever bytes the names hold.
	sort.Slice(entries, func(i, j int) bool {
		return lessPath(entries[i].hdr.Name, entries[j].hdr.Name)
	})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if err := tw.WriteHeader(&e.hdr); err != nil {
			return nil, fmt.Errorf("image %s: %s: %w", s.Ref, e.hdr.Name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("image %s: %s: %w", s.Ref, e.hdr.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	return buf.Bytes(), nil
}

// lessPath orders tar names by their path elements, so a directory comes
// right before what it holds.
func lessPath(a, b string) bool {
	ea := strings.Split(strings.TrimSuffix(a, "/"), "/")
	eb := strings.Split(strings.TrimSuffix(b, "/"), "/")
	for i := 0; i < len(ea) && i < len(eb); i++ {
		if ea[i] != eb[i] {
			return ea[i] < eb[i]
		}
	}
	return len(ea) < len(eb)
}

// tarMode is the tar header's mode of m: permission bits plus setuid,
// setgid and sticky, as c_ISUID, c_ISGID and c_ISVTX.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&os.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// Build assembles the image of s: its one layer (Layer), and a
// configuration with the spec's entrypoint, command, environment, user and
// labels, created at the Unix epoch. The same spec gives the same image
// digest.
func Build(s Spec) (v1.Image, name.Tag, error) {
	if s.Ref == "" {
		return nil, name.Tag{}, errors.New("image: Spec.Ref is empty: name the image, e.g. fiberd.local/fiberd:dev")
	}
	tag, err := name.NewTag(s.Ref, name.StrictValidation)
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("image %s: Spec.Ref: %w: give registry/repository:tag", s.Ref, err)
	}
	layerBytes, err := Layer(s)
	if err != nil {
		return nil, name.Tag{}, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	})
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("image %s: layer: %w", s.Ref, err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	cf = cf.DeepCopy()
	cf.Architecture = s.Arch
	if cf.Architecture == "" {
		cf.Architecture = runtime.GOARCH
	}
	cf.OS = "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = s.Entrypoint
	cf.Config.Cmd = s.Cmd
	cf.Config.Env = s.Env
	if len(cf.Config.Env) == 0 {
		cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	}
	cf.Config.WorkingDir = s.WorkingDir
	if cf.Config.WorkingDir == "" {
		cf.Config.WorkingDir = "/"
	}
	cf.Config.User = s.User
	cf.Config.Labels = s.Labels
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	return img, tag, nil
}

// WriteFile builds the image of s and writes it to file as a tarball
// (docker save's layout, which `ctr images import` and `docker load` read),
// through a temporary file renamed into place. It returns the image's
// manifest digest.
func WriteFile(file string, s Spec) (v1.Hash, error) {
	img, tag, err := Build(s)
	if err != nil {
		return v1.Hash{}, err
	}
	d, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	tmp := file + ".partial"
	f, err := os.Create(tmp)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	err = tarball.Write(tag, img, f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, file)
	}
	if err != nil {
		os.Remove(tmp)
		return v1.Hash{}, fmt.Errorf("image %s: writing %s: %w", s.Ref, file, err)
	}
	return d, nil
}
