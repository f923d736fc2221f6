package devkit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

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
	cmd := exec.Command("sh", filepath.Join(root, "sdk", "zygote", "c", "build.sh"), out, sources[0])
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %v: %s", sources[0], err, bytes.TrimSpace(b))
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

// PythonInterpreter is the absolute path of the python3 on PATH, resolved
// through wrappers (pyenv shims) to the interpreter itself, since templates
// run with a minimal PATH. It fails when there is no python3, it does not
// run, or it reports no absolute path.
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
	return p, nil
}

// CounterCSpec is the spec of the C counter binary bin (from BuildCounterC)
// with args, served from a zygote when zygote is set.
func CounterCSpec(bin string, zygote bool, args ...string) template.Spec {
	return template.Spec{Command: bin, Args: args, Workdir: filepath.Dir(bin), Zygote: zygote}
}

// CounterPySpec is the spec of the checkout root's Python counter run by the
// interpreter py (from PythonInterpreter) with args, served from a zygote
// when zygote is set. PYTHONPATH points at the checkout's Python SDK.
func CounterPySpec(root, py string, zygote bool, args ...string) template.Spec {
	src := filepath.Join(root, "examples", "templates", "python")
	return template.Spec{
		Command: py,
		Args:    append([]string{filepath.Join(src, "counter.py")}, args...),
		Env:     map[string]string{"PYTHONPATH": filepath.Join(root, "sdk", "zygote", "python"), "PYTHONUNBUFFERED": "1"},
		Workdir: src,
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
