package template

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"fiberd.io/fiberd/pkg/core"
)

// MaxSpecBytes is the largest spec file read: 1 MiB. A larger file is
// refused before it is parsed.
const MaxSpecBytes = 1 << 20

// Spec is one template: how to start it and whether it speaks the zygote
// protocol. It is decoded strictly from the spec file: unknown members are
// refused.
type Spec struct {
	// Command is the program to run: an absolute path, or a bare name
	// looked up in the PATH of fiberd when the template is started.
	// Required.
	Command string `json:"command"`
	// Args are the arguments after the program name. Default none.
	Args []string `json:"args,omitempty"`
	// Env is added to the environment the runtime builds (which holds
	// only PATH, LD_BIND_NOW=1 for a zygote, and fiberd's own FIBERD_* and
	// LISTEN_* variables). A key of the template overrides PATH and
	// LD_BIND_NOW but never a FIBERD_* or LISTEN_* variable. Default none.
	Env map[string]string `json:"env,omitempty"`
	// Workdir is the working directory, absolute. Default: the run
	// directory of the grant.
	Workdir string `json:"workdir,omitempty"`
	// Zygote says the command is a zygote: it initialises once, says
	// READY on its control socket and forks a fiber per CLONE (see
	// sdk/zygote). False templates are served only by the exec backend.
	Zygote bool `json:"zygote"`
	// Isolation is how far fibers of one grant are kept apart where the
	// node isolates grants: "" (the default) gives each fiber its own PID
	// namespace and a private /tmp; IsolationShared ("shared") lets the
	// fibers of a grant share the grant's (they still cannot see other
	// grants). Any other value is refused.
	Isolation string `json:"isolation,omitempty"`
	// Network is the network the template's processes use: "" (the
	// default) is the node's; NetworkNone ("none") is a network namespace
	// of the grant's own with only loopback, where fibers still serve on
	// the listener fiberd hands them. A node that cannot give a network
	// namespace refuses to warm such a template. Any other value is
	// refused.
	Network string `json:"network,omitempty"`
}

// The values Spec.Isolation and Spec.Network accept besides "".
const (
	// IsolationShared lets the fibers of a grant share its namespaces.
	IsolationShared = "shared"
	// NetworkNone gives the grant a network namespace with loopback only.
	NetworkNone = "none"
)

// Validate reports the first field that is wrong and how to fix it. The
// error wraps core.ErrInvalid.
func (s Spec) Validate() error {
	switch {
	case s.Command == "":
		return fmt.Errorf("template spec: command is empty: name the program to run: %w", core.ErrInvalid)
	case strings.ContainsRune(s.Command, 0):
		return fmt.Errorf("template spec: command holds a NUL byte: %w", core.ErrInvalid)
	case strings.Contains(s.Command, "/") && !filepath.IsAbs(s.Command):
		return fmt.Errorf("template spec: command %q is a relative path: give an absolute path or a bare name found in PATH: %w", s.Command, core.ErrInvalid)
	case s.Workdir != "" && !filepath.IsAbs(s.Workdir):
		return fmt.Errorf("template spec: workdir %q is not absolute: give the full path: %w", s.Workdir, core.ErrInvalid)
	}
	switch {
	case s.Isolation != "" && s.Isolation != IsolationShared:
		return fmt.Errorf("template spec: isolation %q: leave it out for a PID namespace and /tmp per fiber, or say %q: %w", s.Isolation, IsolationShared, core.ErrInvalid)
	case s.Network != "" && s.Network != NetworkNone:
		return fmt.Errorf("template spec: network %q: leave it out for the node's network, or say %q for loopback only: %w", s.Network, NetworkNone, core.ErrInvalid)
	}
	for i, a := range s.Args {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("template spec: args[%d] holds a NUL byte: %w", i, core.ErrInvalid)
		}
	}
	for k, v := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("template spec: env key %q: keys must be non-empty without '=' or NUL, values without NUL: %w", k, core.ErrInvalid)
		}
	}
	return nil
}

// EnvList returns Env as sorted "KEY=value" strings, the form exec takes.
func (s Spec) EnvList() []string {
	out := make([]string, 0, len(s.Env))
	for k, v := range s.Env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// Parse decodes and validates a spec file's bytes. Unknown members,
// trailing data and files over MaxSpecBytes are refused. Errors wrap
// core.ErrInvalid.
func Parse(b []byte) (Spec, error) {
	if len(b) > MaxSpecBytes {
		return Spec{}, fmt.Errorf("template spec: %d bytes is over the %d byte limit: %w", len(b), MaxSpecBytes, core.ErrInvalid)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var s Spec
	if err := dec.Decode(&s); err != nil {
		return Spec{}, fmt.Errorf("template spec: %v: %w", err, core.ErrInvalid)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Spec{}, fmt.Errorf("template spec: data after the JSON object: %w", core.ErrInvalid)
	}
	if err := s.Validate(); err != nil {
		return Spec{}, err
	}
	return s, nil
}

// Digest is the hex SHA-256 of a spec file's bytes, the digest a grant's
// template reference carries.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Ref is a grant's template reference, "name@sha256:<64 hex>".
type Ref struct {
	// Name is the template's name, the spec file's base name without
	// ".json": a DNS-1123 label (lower-case letters, digits and '-',
	// at most 63 characters).
	Name string
	// Digest is 64 lower-case hex digits.
	Digest string
}

var (
	nameRE   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// String is "name@sha256:<digest>", the form ParseRef reads.
func (r Ref) String() string { return r.Name + "@sha256:" + r.Digest }

// ParseRef reads "name@sha256:<64 lower-case hex>". Anything else is an
// error wrapping core.ErrInvalid.
func ParseRef(s string) (Ref, error) {
	name, digest, ok := strings.Cut(s, "@sha256:")
	switch {
	case !ok:
		return Ref{}, fmt.Errorf("template %q: want name@sha256:<64 hex>: %w", s, core.ErrInvalid)
	case !nameRE.MatchString(name):
		return Ref{}, fmt.Errorf("template %q: name must be a DNS-1123 label: %w", s, core.ErrInvalid)
	case !digestRE.MatchString(digest):
		return Ref{}, fmt.Errorf("template %q: digest must be 64 lower-case hex digits: %w", s, core.ErrInvalid)
	}
	return Ref{Name: name, Digest: digest}, nil
}

// ErrDigestMismatch is wrapped by Resolve when the spec file's digest is not
// the one the grant names. It also wraps core.ErrInvalid.
var ErrDigestMismatch = fmt.Errorf("template digest mismatch: %w", core.ErrInvalid)

// Dir is a directory of template specs, one <name>.json per template. The
// zero value is not usable. A Dir holds no state: every Resolve reads the
// file again, so an operator may edit specs while fiberd runs (grants then
// naming the old digest are refused).
type Dir string

// Resolve reads the spec a grant's template reference names and checks its
// digest. It fails, with an error naming the template, when ref is
// malformed (core.ErrInvalid), the file is missing (fs.ErrNotExist and
// core.ErrInvalid), the file's digest differs (ErrDigestMismatch; the
// message names both digests), or the spec is malformed (core.ErrInvalid).
// pkg/fiberd calls it when it admits a grant.
func (d Dir) Resolve(ref string) (Spec, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return Spec{}, err
	}
	path := filepath.Join(string(d), r.Name+".json")
	b, err := core.ReadFileBounded(path, MaxSpecBytes)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Spec{}, fmt.Errorf("template %q: no spec %s on this node (grant names sha256:%s, node has none): %w: %w", r.Name, path, r.Digest, fs.ErrNotExist, core.ErrInvalid)
		}
		return Spec{}, fmt.Errorf("template %q: %w", r.Name, err)
	}
	if got := Digest(b); got != r.Digest {
		return Spec{}, fmt.Errorf("template %q: grant names sha256:%s but %s has sha256:%s: %w", r.Name, r.Digest, path, got, ErrDigestMismatch)
	}
	s, err := Parse(b)
	if err != nil {
		return Spec{}, fmt.Errorf("template %q: %w", r.Name, err)
	}
	return s, nil
}
