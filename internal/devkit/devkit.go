package devkit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

// FindCheckout finds the fiberd checkout whose examples are used: the
// working directory or one above it, else the executable's directory or one
// above it (a binary built into the checkout's bin/). It fails, saying how to
// fix it, when neither lies in a checkout.
func FindCheckout() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	for _, dir := range starts {
		for {
			if IsCheckout(dir) {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", errors.New("cannot find the example templates (examples/templates and sdk/zygote): run fiberd -dev inside the fiberd checkout, or pass -templates DIR")
}

// IsCheckout reports whether dir holds the example templates and the C
// zygote SDK.
func IsCheckout(dir string) bool {
	for _, p := range []string{"examples/templates/c/counter.c", "examples/templates/python/counter.py", "sdk/zygote/c/build.sh"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			return false
		}
	}
	return true
}

// BuildCounterC compiles the checkout root's C counter with the SDK's build
// script into the directory out and returns the binary's path. It builds
// nothing when the binary is newer than every source. $CC names the
// compiler (default cc); it fails naming the compiler when there is none,
// and with the compiler's output when the build fails.
func BuildCounterC(root, out string) (string, error) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		return "", fmt.Errorf("no C compiler (%s) found: %w", cc, err)
	}
	bin := filepath.Join(out, "counter")
	sources := []string{
		filepath.Join(root, "examples", "templates", "c", "counter.c"),
		filepath.Join(root, "sdk", "zygote", "c", "fiberzygote.c"),
		filepath.Join(root, "sdk", "zygote", "c", "fiberzygote.h"),
	}
	if upToDate(bin, sources) {
		return bin, nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	// Built aside and renamed into place: a fiberd -dev of the same
	// checkout building at the same time never runs a half-written binary.
	tmp, err := os.MkdirTemp(out, ".build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("sh", filepath.Join(root, "sdk", "zygote", "c", "build.sh"), tmp, sources[0])
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %v: %s", sources[0], err, bytes.TrimSpace(b))
	}
	// Others (an isolated grant's user) may run it whatever the umask.
	if err := os.Chmod(filepath.Join(tmp, "counter"), 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(filepath.Join(tmp, "counter"), bin); err != nil {
		return "", err
	}
	return bin, nil
}

func upToDate(bin string, sources []string) bool {
	bi, err := os.Stat(bin)
	if err != nil {
		return false
	}
	for _, s := range sources {
		si, err := os.Stat(s)
		if err != nil || si.ModTime().After(bi.ModTime()) {
			return false
		}
	}
	return true
}

// systemPythons are the interpreters PythonInterpreter falls back to when
// an isolated grant cannot run the one on PATH.
var systemPythons = []string{"/usr/bin/python3", "/usr/local/bin/python3"}

// PythonInterpreter is the absolute path of a python3 for the example
// templates: the python3 on PATH, resolved through wrappers (pyenv shims)
// to the interpreter itself, since templates run with a minimal PATH;
// unless an isolated grant's user could not read it (backend.
// ReadableByGrants: pyenv's, under a home directory only its owner
// enters), in which case the first of /usr/bin/python3 and
// /usr/local/bin/python3 that user can read, if any. It fails when there
// is no python3, it does not run, or it reports no absolute path.
func PythonInterpreter() (string, error) {
	if _, err := exec.LookPath("python3"); err != nil {
		return "", fmt.Errorf("no python3 found: %w", err)
	}
	b, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		return "", fmt.Errorf("python3 does not run: %w", err)
	}
	p := strings.TrimSpace(string(b))
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("python3 reports no absolute executable (%q)", p)
	}
	if backend.ReadableByGrants(p) == nil {
		return p, nil
	}
	for _, sys := range systemPythons {
		if backend.ReadableByGrants(sys) == nil {
			return sys, nil
		}
	}
	return p, nil
}

// ExamplesBase is where SharePythonExample copies the Python example.
const ExamplesBase = "/var/cache/fiberd/examples"

// SharePythonExample copies the Python counter and the Python zygote SDK
// of checkout root where an isolated grant's user can read them (a
// directory under /tmp, or a checkout under /root, it cannot):
// ExamplesBase/python-<the first 12 hex digits of the SHA-256 of their
// bytes>, made (0755, with its parents) when missing, so every checkout
// with the same files shares one copy and nothing piles up. It returns
// that directory, which CounterPySpec takes as its root. It fails when
// the copy cannot be made there or others cannot read it, as for a fiberd
// that is not root, which cannot isolate grants anyway; the caller then
// keeps the files where it likes (CopyPythonExample).
func SharePythonExample(root string) (string, error) {
	h := sha256.New()
	for _, rel := range pythonFiles {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
	}
	dir := filepath.Join(ExamplesBase, "python-"+hex.EncodeToString(h.Sum(nil)[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// MkdirAll honours the umask: open each directory it may have made.
	for d := dir; d != filepath.Dir(ExamplesBase); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			return "", err
		}
	}
	if err := backend.ReadableByGrants(dir); err != nil {
		return "", err
	}
	return CopyPythonExample(root, dir)
}

// pythonFiles are the files of a checkout the Python counter runs.
var pythonFiles = []string{
	filepath.Join("examples", "templates", "python", "counter.py"),
	filepath.Join("sdk", "zygote", "python", "fiberzygote.py"),
}

// CopyPythonExample copies the Python counter and the Python zygote SDK of
// checkout root into dir, in the checkout's layout (files 0644,
// directories 0755), and returns dir, which CounterPySpec takes as its
// root. A file that already holds the same bytes is left alone; another is
// replaced atomically, so a fiberd -dev of the same checkout starting at
// the same time reads one whole file or the other.
func CopyPythonExample(root, dir string) (string, error) {
	for _, rel := range pythonFiles {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return "", err
		}
		dst := filepath.Join(dir, rel)
		if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, b) {
			continue
		}
		for d := filepath.Dir(dst); len(d) > len(dir); d = filepath.Dir(d) {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return "", err
			}
			if err := os.Chmod(d, 0o755); err != nil {
				return "", err
			}
		}
		if err := core.WriteFileAtomic(dst, b, 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// CounterCSpec is the spec of the C counter binary bin (from BuildCounterC)
// with args, served from a zygote when zygote is set. It names no workdir:
// the template works in its grant's run directory (its home there when
// isolated), and fiberd opens bin itself, so an isolated grant runs it
// wherever it lies.
func CounterCSpec(bin string, zygote bool, args ...string) template.Spec {
	return template.Spec{Command: bin, Args: args, Zygote: zygote}
}

// CounterPySpec is the spec of the Python counter of root (a checkout, or
// a copy from CopyPythonExample) run by the interpreter py (from
// PythonInterpreter) with args, served from a zygote when zygote is set.
// PYTHONPATH points at root's Python SDK. It names no workdir (see
// CounterCSpec); an isolated grant must be able to read root's files.
func CounterPySpec(root, py string, zygote bool, args ...string) template.Spec {
	return template.Spec{
		Command: py,
		Args:    append([]string{filepath.Join(root, pythonFiles[0])}, args...),
		Env:     map[string]string{"PYTHONPATH": filepath.Join(root, filepath.Dir(pythonFiles[1])), "PYTHONUNBUFFERED": "1"},
		Zygote:  zygote,
	}
}

// ColdName is the template name of the BASIC twin of a zygote template:
// name itself when zygote is set, name + "-cold" otherwise.
func ColdName(name string, zygote bool) string {
	if zygote {
		return name
	}
	return name + "-cold"
}

// WriteSpec writes s as dir/<name>.json (indented JSON and a newline) and
// returns the bytes, which a grant's template digest is taken of. A file
// that already holds those bytes is left alone, so its digest and mtime stay;
// otherwise it is replaced atomically.
func WriteSpec(dir, name string, s template.Spec) ([]byte, error) {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("template %q: %w", name, err)
	}
	b = append(b, '\n')
	path := filepath.Join(dir, name+".json")
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, b) {
		return b, nil
	}
	if err := core.WriteFileAtomic(path, b, 0o644); err != nil {
		return nil, fmt.Errorf("template %q: %w", name, err)
	}
	return b, nil
}
