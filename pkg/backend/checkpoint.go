package backend

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

// Checkpointer parks running fibers to disk and resumes them: the
// CHECKPOINT tier. Proc implements it with CRIU (Config.CRIU); the agent
// asks it with a type assertion on the WARM backend. Every method is safe
// for concurrent use, for different fibers.
//
// Vocabulary: a running fiber is parked by Park: its process tree is
// written to an image directory and the fiber ends (its Exit says
// Reason.Parked). Resume restores an image as a running fiber again, with a
// new fence, tracked like a cloned one (Kill, Stop, Exits). An image is
// complete once Park returned it; it is usable while the grant, its epoch
// and its template are those it was parked under.
type Checkpointer interface {
	// CheckpointSupport reports whether this backend can park: nil when
	// the CRIU at Config.CRIU works here, otherwise an error wrapping
	// core.ErrTierGap that names what is missing (no path configured, no
	// binary, a CRIU older than 4.2, `criu check` failing, a missing
	// capability). The first call probes (it runs `criu --version` and
	// `criu check`, about 0.2 s) and logs the outcome once; later calls
	// return that result, except a probe cut short by ctx, which the
	// next call repeats. Park and Resume call it first. The agent calls
	// it at start to decide whether it serves CHECKPOINT and says the
	// reason in its status when not.
	CheckpointSupport(ctx context.Context) error

	// CheckpointIsolated reports whether the fibers of a grant isolated
	// at level (GrantIsolation) can be parked, once CheckpointSupport has
	// said the backend parks: nil at IsolationNone and at IsolationFiber
	// where the CRIU carries fiberd's patches (hack/criu.sh) and fiberd
	// has CAP_SYS_ADMIN; otherwise an error wrapping core.ErrTierGap
	// that names what is missing. At IsolationGrant a fiber shares the
	// PID namespace its zygote leads, which CRIU dumps only whole: always
	// a tier gap. It does not probe, and is cheap.
	CheckpointIsolated(level Isolation) error

	// Park checkpoints a running fiber's process tree into req.Dir and
	// ends the fiber: its Exit (Reason.Parked) is queued, its leaf
	// removed and its pid released before Park returns. The image is
	// written into req.Dir + ".partial" and renamed to req.Dir once
	// complete, its manifest last, so a crash mid-park leaves either a
	// complete image or none (a stale .partial directory, which the next
	// Park to the same Dir or RemoveImage removes). It fails, leaving the
	// fiber running, with core.ErrNotFound for a fence that is not
	// running, ErrTooLarge when the fiber's memory is over req.MaxBytes,
	// core.ErrInvalid for a bad request, core.ErrTierGap for a fiber CRIU
	// cannot park (inside a pid namespace it does not lead, an MPTCP
	// listener), ErrBusy while a connection to its unix listener is
	// open, and with CRIU's own reason (the error lines of its log;
	// wrapping ErrNoSpace when the image's filesystem filled up) when the
	// dump fails. Live
	// connections of the fiber are closed; connections waiting in its
	// listener's queue are reset. The agent calls it on POST /v1/park
	// and, under memory pressure, for the largest idle fiber.
	Park(ctx context.Context, req ParkRequest) (Image, error)

	// Resume restores a parked image as a running fiber with a new fence
	// and returns once it runs (its listener accepts). The image must be
	// of req.Fence's grant and epoch and of req.Template; an image that
	// can never be resumed (another grant, an older epoch, another
	// template or template spec, a missing or damaged file) fails with
	// ErrImageUnusable, and the caller deletes it. Any other failure
	// (the grant is not warm: ErrCold; the fiber's pid is taken; the
	// TCP address is in use; CRIU's own reason) leaves the image as it
	// was, to be tried again. Nothing of a failed Resume keeps running.
	// The image directory is not removed by a successful Resume either:
	// the caller deletes it (RemoveImage) once it no longer needs it.
	// The agent calls it for a Clone that names a parked session.
	Resume(ctx context.Context, req ResumeRequest) (Resumed, error)
}

// ErrImageUnusable is wrapped by Resume when the image can never be
// resumed: it belongs to another grant, epoch or template, or it is damaged
// or incomplete. The caller deletes it.
var ErrImageUnusable = errors.New("parked image unusable")

// ErrTooLarge is wrapped by Park when the fiber's memory, the image's size,
// would be over ParkRequest.MaxBytes. The fiber keeps running.
var ErrTooLarge = core.NewError(core.ErrInsufficientStorage, "fiber too large to park")

// ErrNoSpace is wrapped by Park when the dump failed because the image's
// filesystem is full (ENOSPC, or a disk quota). The fiber keeps running;
// the partial image is removed.
var ErrNoSpace = core.NewError(core.ErrInsufficientStorage, "no space left for the image")

// ErrBusy is wrapped by Park when the fiber cannot be parked as it is now,
// but could be once it is idle: a connection to its unix listener is open
// or waiting to be accepted (CRIU cannot dump one end of a unix
// connection). The fiber keeps running.
var ErrBusy = core.NewError(core.ErrBusy, "fiber busy")

// ParkRequest asks a Checkpointer to park one running fiber.
type ParkRequest struct {
	// Fence is the running fiber to park. Required.
	Fence core.Fence
	// Dir is the image directory to create: an absolute path that does
	// not exist yet, in a directory that does (the grant's state
	// directory). Park also uses Dir + ".partial" while it writes.
	// Required.
	Dir string
	// Template is the grant's template reference (name@sha256:digest),
	// recorded in the image: Resume refuses the image under any other.
	// Required.
	Template string
	// MaxBytes bounds the image: Park refuses a fiber whose memory to
	// write (the anonymous, shared-memory and swapped pages of its
	// processes, read from /proc/<pid>/smaps_rollup before the dump) is
	// over it, and the fiber keeps running. The pages the fiber shares
	// with its zygote count too: an image holds every page the fiber
	// maps. The image's metadata and page alignment may add a few
	// hundred KiB over the estimate. 0 means no bound.
	MaxBytes int64
}

// Image is a complete parked image as Park returns it.
type Image struct {
	// Dir is the image directory (ParkRequest.Dir).
	Dir string
	// Bytes is the size of the image's files.
	Bytes int64
	// OwnBytes is the memory the fiber did not share with anyone when it
	// was parked (Private_Clean + Private_Dirty + Swap of its processes):
	// what it cost beyond its zygote. Bytes is larger, since an image
	// also holds the pages shared with the zygote.
	OwnBytes int64
	// Network and Addr are the fiber's listener (descriptor 3) when it
	// was parked: "tcp" or "unix", and its address; both empty when
	// descriptor 3 was not a listening socket. A TCP listener is
	// restored at this address (see ResumeRequest.Listener).
	Network, Addr string
}

// ResumeRequest asks a Checkpointer to resume one parked image.
type ResumeRequest struct {
	// Fence is the resumed fiber's fence: of the image's grant and epoch,
	// newer than the fence it was parked under. Required.
	Fence core.Fence
	// Image is the image directory Park returned. Required.
	Image string
	// Template is the grant's template reference now; it must be the one
	// the image was parked under. Required.
	Template string
	// Listener is the fiber's listener after resume, its descriptor 3.
	// For a unix image it is required: any bound, listening unix stream
	// socket, handed over as is (CRIU's --inherit-fd), so the fiber may
	// serve at a new path; the caller keeps its copy, as with Clone. For
	// a TCP image CRIU cannot hand a socket over: the fiber's listener is
	// created anew at the address it had (Image.Addr). Listener is then
	// either nil (the address must be free) or a socket bound to that
	// address, which Resume closes just before CRIU binds it again, also
	// when Resume then fails; the caller must hold no other copy of it.
	Listener *os.File
	// Leaf is the fiber's new cgroup v2 leaf, created by the caller. The
	// fiber is restored into it (CRIU runs there). Empty restores it into
	// fiberd's own cgroup; it is then killed by process group.
	Leaf string
}

// Resumed is a fiber Resume restored.
type Resumed struct {
	// Fiber is the running fiber: its new fence and its pid.
	Fiber Fiber
	// Listener is the fiber's listener for the caller to keep (and close)
	// as it keeps every fiber's: req.Listener itself for a unix image, a
	// copy of the restored socket for a TCP image.
	Listener *os.File
}

// RemoveImage deletes a parked image and any partial image Park left at the
// same place. A missing image is not an error. The agent calls it when the
// session is released, its grant ends, the epoch is bumped, the lease
// expires, or Resume said ErrImageUnusable.
func RemoveImage(dir string) error {
	if dir == "" || !filepath.IsAbs(dir) {
		return fmt.Errorf("image %q: not an absolute path: %w", dir, core.ErrInvalid)
	}
	return errors.Join(os.RemoveAll(dir+partialSuffix), os.RemoveAll(dir))
}

// partialSuffix names the directory Park writes into before the rename.
const partialSuffix = ".partial"

// DefaultCRIUPath is where hack/criu.sh installs the CRIU it builds:
// $HOME/.cache/fiberd/criu/bin/criu, or "" when the home directory is
// unknown. cmd/fiberd uses it as its flag's default.
func DefaultCRIUPath() string {
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return ""
	}
	return filepath.Join(home, ".cache", "fiberd", "criu", "bin", "criu")
}

// The manifest: what an image records besides CRIU's own files, written
// last, as manifestName.

const (
	manifestName    = "fiberd-image.json"
	manifestVersion = 1
	// maxManifestBytes bounds the manifest read at Resume.
	maxManifestBytes = 64 << 10
	// maxImageFiles bounds the files a manifest may list.
	maxImageFiles = 4096
)

// manifest is the image's record of whom it belongs to and what it needs at
// Resume. It is decoded strictly: unknown members are refused.
type manifest struct {
	Version int `json:"version"`
	// GrantUID, Epoch and Seq are the fence the fiber ran under.
	GrantUID string `json:"grantUID"`
	Epoch    uint64 `json:"epoch"`
	Seq      uint64 `json:"seq"`
	// Template is ParkRequest.Template.
	Template string `json:"template"`
	// SpecDigest is specDigest of the zygote's spec at park.
	SpecDigest string `json:"specDigest"`
	// PID is the fiber's pid in fiberd's pid namespace when parked.
	PID int `json:"pid"`
	// Comm is the fiber's process name (/proc/<pid>/comm), at most 15
	// bytes.
	Comm string `json:"comm,omitempty"`
	// OwnPIDNS is set when the fiber was the init of its own pid
	// namespace (it is then restored into a new one, under a new pid).
	OwnPIDNS bool `json:"ownPidns,omitempty"`
	// Network, Addr and Inode describe descriptor 3 when it was a
	// listening socket ("tcp", "tcp6" or "unix").
	Network string `json:"network,omitempty"`
	Addr    string `json:"addr,omitempty"`
	Inode   uint64 `json:"inode,omitempty"`
	// Pipes are the inodes of the pipes among descriptors 0-2 (the
	// template's log): they are mapped to the grant's log at Resume.
	Pipes []uint64 `json:"pipes,omitempty"`
	// Files maps each file CRIU wrote to its size, so Resume finds a
	// truncated or missing file before CRIU does.
	Files map[string]int64 `json:"files"`
	// OwnBytes is Image.OwnBytes.
	OwnBytes int64 `json:"ownBytes"`
	// UserNS is set when the fiber had a user namespace of its own (its
	// grant was isolated): criu dumped its namespaces, and restores them
	// from the shelf (shelf_linux.go).
	UserNS bool `json:"userns,omitempty"`
	// Externals are the files criu took as external (UserNS only); Resume
	// hands criu the same files again.
	Externals []externalFile `json:"externals,omitempty"`
	// CRIU is the version that wrote the image.
	CRIU string `json:"criu"`
}

// parseManifest decodes and checks a manifest. Every refusal wraps
// ErrImageUnusable.
func parseManifest(b []byte) (manifest, error) {
	var m manifest
	bad := func(format string, a ...any) (manifest, error) {
		return manifest{}, fmt.Errorf("manifest: %s: %w", fmt.Sprintf(format, a...), ErrImageUnusable)
	}
	if len(b) > maxManifestBytes {
		return bad("%d bytes, over %d", len(b), maxManifestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return bad("%v", err)
	}
	if dec.More() {
		return bad("trailing data after the object")
	}
	switch {
	case m.Version != manifestVersion:
		return bad("version %d, this fiberd reads %d", m.Version, manifestVersion)
	case m.GrantUID == "" || strings.ContainsRune(m.GrantUID, '/'):
		return bad("grantUID %q is empty or holds '/'", m.GrantUID)
	case m.Template == "":
		return bad("template is empty")
	case len(m.SpecDigest) != 64:
		return bad("specDigest %q is not 64 hex digits", m.SpecDigest)
	case m.PID <= 0:
		return bad("pid %d is not positive", m.PID)
	case len(m.Comm) > 15:
		return bad("comm %q is over 15 bytes", m.Comm)
	case m.Network != "" && m.Network != "tcp" && m.Network != "tcp6" && m.Network != "unix":
		return bad("network %q is not tcp, tcp6 or unix", m.Network)
	case m.Network != "" && (m.Addr == "" || m.Inode == 0):
		return bad("listener %s without address or inode", m.Network)
	case len(m.Pipes) > 3:
		return bad("%d pipes among descriptors 0-2", len(m.Pipes))
	case len(m.Files) == 0 || len(m.Files) > maxImageFiles:
		return bad("%d files listed (want 1 to %d)", len(m.Files), maxImageFiles)
	case m.OwnBytes < 0:
		return bad("ownBytes %d is negative", m.OwnBytes)
	}
	for name, size := range m.Files {
		if name == "" || name != filepath.Base(name) || name == "." || name == ".." || name == manifestName || size < 0 {
			return bad("file entry %q (%d bytes) is not a plain file name with a size", name, size)
		}
	}
	return m, nil
}

// fence is the fence the image was parked under.
func (m manifest) fence() core.Fence {
	return core.Fence{GrantUID: m.GrantUID, Epoch: m.Epoch, Seq: m.Seq}
}

// bytes is the size of the image's files.
func (m manifest) bytes() int64 {
	var n int64
	for _, s := range m.Files {
		n += s
	}
	return n
}

// usableFor refuses an image that must never be resumed as req: another
// grant, another epoch (an older one is stale; a newer one cannot be
// ours), or another template. A fence that is not newer than the parked
// one is the caller's mistake (core.ErrInvalid), not the image's.
func (m manifest) usableFor(req ResumeRequest) error {
	switch {
	case m.GrantUID != req.Fence.GrantUID:
		return fmt.Errorf("image of grant %q, not %q: %w", m.GrantUID, req.Fence.GrantUID, ErrImageUnusable)
	case m.Epoch != req.Fence.Epoch:
		return fmt.Errorf("image of epoch %d, now %d: %w", m.Epoch, req.Fence.Epoch, ErrImageUnusable)
	case m.Template != req.Template:
		return fmt.Errorf("image of template %s, the grant now runs %s: %w", m.Template, req.Template, ErrImageUnusable)
	}
	if c, _ := req.Fence.Compare(m.fence()); c <= 0 {
		return fmt.Errorf("fence %s is not newer than the parked fiber's %s: %w", req.Fence, m.fence(), core.ErrInvalid)
	}
	return nil
}

// specDigest is the hex SHA-256 of the spec's JSON form (map keys sorted):
// an image is resumed only by a zygote of the same spec.
func specDigest(s template.Spec) string {
	b, _ := json.Marshal(s)
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Validate refuses, with core.ErrInvalid, a malformed ParkRequest: no
// grant, a Dir that is not a clean absolute path, no template, a negative
// MaxBytes. Every Checkpointer refuses these before anything else.
func (req ParkRequest) Validate() error {
	switch {
	case req.Fence.GrantUID == "":
		return fmt.Errorf("park: Fence.GrantUID is empty: %w", core.ErrInvalid)
	case req.Dir == "" || !filepath.IsAbs(req.Dir) || filepath.Clean(req.Dir) != req.Dir:
		return fmt.Errorf("fiber %s: park: Dir %q is not a clean absolute path: %w", req.Fence, req.Dir, core.ErrInvalid)
	case req.Template == "":
		return fmt.Errorf("fiber %s: park: Template is empty: %w", req.Fence, core.ErrInvalid)
	case req.MaxBytes < 0:
		return fmt.Errorf("fiber %s: park: MaxBytes %d is negative: %w", req.Fence, req.MaxBytes, core.ErrInvalid)
	}
	return nil
}

// Validate refuses, with core.ErrInvalid, a malformed ResumeRequest: no
// grant, an Image or Leaf path that is not absolute, no template. Every
// Checkpointer refuses these before anything else.
func (req ResumeRequest) Validate() error {
	switch {
	case req.Fence.GrantUID == "":
		return fmt.Errorf("resume: Fence.GrantUID is empty: %w", core.ErrInvalid)
	case req.Image == "" || !filepath.IsAbs(req.Image):
		return fmt.Errorf("fiber %s: resume: Image %q is not absolute: %w", req.Fence, req.Image, core.ErrInvalid)
	case req.Template == "":
		return fmt.Errorf("fiber %s: resume: Template is empty: %w", req.Fence, core.ErrInvalid)
	case req.Leaf != "" && !filepath.IsAbs(req.Leaf):
		return fmt.Errorf("fiber %s: resume: Leaf %q is not absolute: %w", req.Fence, req.Leaf, core.ErrInvalid)
	}
	return nil
}

// externalFile is a file of a parked fiber that criu cannot find from
// inside the fiber's mount namespace, so fiberd hands it to criu again at
// resume: the grant's home (the zygote's working directory), and the
// command fiberd opened for nsinit.
type externalFile struct {
	// Path is where fiberd opens it again: the home directory, the
	// command as resolved at warm.
	Path string `json:"path"`
	// Key is CRIU's name of it, file[MNT:INO] in hexadecimal: the mount
	// it was opened on and its inode. A file at Path with another key is
	// not the one the fiber had.
	Key string `json:"key"`
}
