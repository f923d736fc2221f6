package docs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"fiberd.io/fiberd/internal/repotest"
)

// Bounds of the check. A document that runs longer has a command that hangs.
const (
	docTimeout   = 2 * time.Minute
	devReadyWait = 3 * time.Minute
	outputTail   = 60
)

// documents are the files docs-check reads: README.md and docs/*.md, by path
// relative to the root.
func documents(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{}
	if _, err := os.Stat(filepath.Join(root, "README.md")); err == nil {
		out = append(out, "README.md")
	} else {
		t.Log("README.md is missing; checking docs/ only")
	}
	for _, d := range docs {
		out = append(out, filepath.Join("docs", filepath.Base(d)))
	}
	return out
}

func readDoc(t *testing.T, root, doc string) (string, []block) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, doc))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := parseBlocks(string(b))
	if err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	return string(b), blocks
}

// needTools skips the test when a tool the documents use is missing.
func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("docs-check needs %s on PATH: %v", tool, err)
		}
	}
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// binaries builds fiberd and fiberctl once per test binary into a
// directory of its own and returns it.
func binaries(t *testing.T, root string) string {
	t.Helper()
	needTools(t, "go")
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "fiberd-docs-bin-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", buildDir+"/", "./cmd/fiberd", "./cmd/fiberctl")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// devFiberd is the `fiberd -dev` the documents run against.
type devFiberd struct {
	cmd    *exec.Cmd
	state  string
	socket string
	out    string // its stdout, the -dev announcement
	log    string // its stderr
	exited chan error
}

// startDev starts fiberd -dev in work with its own state directory and a
// loopback port of its own, and waits until it announces that it serves.
func startDev(t *testing.T, root, bin, work string) *devFiberd {
	t.Helper()
	d := &devFiberd{
		state: filepath.Join(work, "state"),
		out:   filepath.Join(work, "fiberd.out"),
		log:   filepath.Join(work, "fiberd.log"),
	}
	d.socket = filepath.Join(d.state, "fiberd.sock")
	stdout, err := os.Create(d.out)
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(d.log)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	d.cmd = exec.Command(filepath.Join(bin, "fiberd"), "-dev", "-state", d.state, "-listen", "127.0.0.1:0")
	d.cmd.Dir = root
	d.cmd.Env = docEnv(bin, work, "")
	d.cmd.Stdout, d.cmd.Stderr = stdout, stderr
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.exited = make(chan error, 1)
	go func() { d.exited <- d.cmd.Wait() }()
	t.Cleanup(func() { d.stop(t) })

	deadline := time.Now().Add(devReadyWait)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(d.out)
		if bytes.Contains(b, []byte("fiberd -dev is serving")) {
			return d
		}
		select {
		case err := <-d.exited:
			d.exited <- err
			t.Fatalf("fiberd -dev exited before serving: %v\n%s", err, tailFile(d.log, outputTail))
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Fatalf("fiberd -dev did not announce itself within %v\n%s", devReadyWait, tailFile(d.log, outputTail))
	return nil
}

// stop sends SIGTERM and waits for the drain; fiberd must exit 0.
func (d *devFiberd) stop(t *testing.T) {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.exited:
		d.exited <- err
		if err != nil {
			t.Errorf("fiberd -dev after SIGTERM: %v\n%s", err, tailFile(d.log, outputTail))
		}
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		t.Errorf("fiberd -dev did not stop within 30s of SIGTERM\n%s", tailFile(d.log, outputTail))
	}
}

// docEnv is the environment of a document's shell: this one without any
// FIBERD_* variable, the binaries first on PATH, TMPDIR under work, and
// FIBERD_ADDR when addr is set.
func docEnv(bin, work, addr string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "FIBERD_") || k == "PATH" || k == "TMPDIR" {
			continue
		}
		env = append(env, kv)
	}
	tmp := filepath.Join(work, "tmp")
	_ = os.MkdirAll(tmp, 0o700)
	env = append(env, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "TMPDIR="+tmp)
	if addr != "" {
		env = append(env, "FIBERD_ADDR="+addr)
	}
	return env
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestDocs runs the sh blocks of every document against a fiberd -dev, in
// document order, and then checks the metrics that fiberd serves are
// documented.
func TestDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("docs-check starts fiberd and runs every document; skipped under -short")
	}
	needTools(t, "bash", "curl", "cc", "python3", "jq", "base64", "sha256sum")
	root := repotest.Root(t)
	bin := binaries(t, root)
	work, err := os.MkdirTemp("", "fiberd-docs-")
	if err != nil {
		t.Fatal(err)
	}
	// Removed after fiberd has stopped (cleanups run last-in first-out),
	// unless DOCS_CHECK_KEEP is set: then each document's script and
	// output stay in work/docs/<document>/.
	t.Cleanup(func() {
		if os.Getenv("DOCS_CHECK_KEEP") != "" {
			t.Logf("kept %s (DOCS_CHECK_KEEP)", work)
			return
		}
		os.RemoveAll(work)
	})
	// Documents run in a copy of the checkout, as a reader runs them in
	// theirs: a command that writes into the tree cannot change this one.
	tree := copyCheckout(t, root, filepath.Join(work, "checkout"))
	dev := startDev(t, tree, bin, work)

	for _, doc := range documents(t, root) {
		t.Run(strings.ReplaceAll(doc, "/", "_"), func(t *testing.T) {
			runDoc(t, root, tree, bin, work, dev, doc)
		})
	}
	t.Run("metrics documented", func(t *testing.T) {
		names := scrapeMetrics(t, dev.socket)
		for _, doc := range []string{"docs/api.md", "docs/operations.md"} {
			b, err := os.ReadFile(filepath.Join(root, doc))
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range names {
				if !bytes.Contains(b, []byte("`"+n+"`")) {
					t.Errorf("%s does not name the metric `%s` that fiberd serves on GET /metrics", doc, n)
				}
			}
		}
	})
}

// runDoc runs one document's blocks in one bash process started in tree,
// the copy of the checkout, and reports the first failing command with its
// document line and output.
func runDoc(t *testing.T, root, tree, bin, work string, dev *devFiberd, doc string) {
	src, blocks := readDoc(t, root, doc)
	runs := 0
	for _, b := range blocks {
		switch b.kind() {
		case "run", "file":
			runs++
		}
	}
	if runs == 0 {
		t.Logf("%s: no sh blocks to run", doc)
		return
	}
	sc, err := script(src, blocks)
	if err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	dir := filepath.Join(work, "docs", strings.ReplaceAll(doc, "/", "_"))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "script.sh")
	if err := os.WriteFile(path, []byte(sc), 0o600); err != nil {
		t.Fatal(err)
	}
	outPath := filepath.Join(dir, "output")
	out, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()

	ctx, cancel := context.WithTimeout(context.Background(), docTimeout)
	defer cancel()
	cmd := exec.Command("bash", path)
	cmd.Dir = tree
	cmd.Env = append(docEnv(bin, work, "unix://"+dev.socket), "DOCS_CHECK=1")
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var runErr error
	timedOut := false
	select {
	case runErr = <-done:
	case <-ctx.Done():
		timedOut = true
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		runErr = <-done
	}
	killGroup(cmd.Process.Pid)
	t.Logf("%s: %d blocks ran in %v", doc, runs, time.Since(start).Round(time.Millisecond))

	if runErr == nil {
		return
	}
	b, _ := os.ReadFile(outPath)
	line, status, command, lastBlock, blockOut := failure(string(b), outputTail)
	switch {
	case timedOut:
		t.Errorf("%s:%s: the block starting here still ran after %v (a command that never returns, such as a server in the foreground?); its output:\n%s",
			doc, lastBlock, docTimeout, strings.Join(blockOut, "\n"))
	case line != "":
		t.Errorf("%s:%s: `%s` exited %s; output of its block:\n%s", doc, line, command, status, strings.Join(blockOut, "\n"))
	default:
		t.Errorf("%s: bash: %v; output of the last block:\n%s", doc, runErr, strings.Join(blockOut, "\n"))
	}
}

// maxCopy is the largest file copyCheckout copies: a stray build output in
// the working tree is no source a document needs.
const maxCopy = 4 << 20

// copyCheckout copies the files of the checkout at root that git tracks or
// would track (untracked files not ignored, so work not yet committed is
// there too) into dst, and returns dst.
func copyCheckout(t *testing.T, root, dst string) string {
	t.Helper()
	needTools(t, "git")
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files in %s: %v", root, err)
	}
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, rel)
		fi, err := os.Lstat(src)
		if err != nil {
			continue // deleted in the working tree
		}
		to := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err == nil {
				err = os.Symlink(target, to)
			}
			if err != nil {
				t.Fatal(err)
			}
		case fi.Mode().IsRegular() && fi.Size() <= maxCopy:
			b, err := os.ReadFile(src)
			if err == nil {
				err = os.WriteFile(to, b, fi.Mode().Perm())
			}
			if err != nil {
				t.Fatal(err)
			}
		case fi.Mode().IsRegular():
			t.Logf("not copying %s (%d bytes): no document needs a file that large", rel, fi.Size())
		}
	}
	return dst
}

// killGroup ends what a document left running in its process group:
// SIGTERM first, so a fiberd it started drains its zygotes, then SIGKILL.
func killGroup(pgid int) {
	if syscall.Kill(-pgid, syscall.SIGTERM) != nil {
		return // nothing left
	}
	for i := 0; i < 100; i++ {
		time.Sleep(100 * time.Millisecond)
		if syscall.Kill(-pgid, 0) != nil {
			return
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// scrapeMetrics reads the fiberd_* metric families from fiberd's GET
// /metrics on its unix socket.
func scrapeMetrics(t *testing.T, socket string) []string {
	t.Helper()
	c := &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}},
	}
	resp, err := c.Get("http://fiberd/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^# TYPE (fiberd_[a-z0-9_]+) `)
	var names []string
	for _, m := range re.FindAllStringSubmatch(buf.String(), -1) {
		names = append(names, m[1])
	}
	if len(names) == 0 {
		t.Fatalf("GET /metrics served no fiberd_* metric:\n%s", buf.String())
	}
	return names
}

// TestFlagsDocumented: every flag of `fiberd -h` has a row in the flags
// table of docs/operations.md, and every row there is a flag of fiberd (or
// of its testhooks build, which says so).
func TestFlagsDocumented(t *testing.T) {
	root := repotest.Root(t)
	bin := binaries(t, root)
	cmd := exec.Command(filepath.Join(bin, "fiberd"), "-h")
	var usage bytes.Buffer
	cmd.Stdout, cmd.Stderr = &usage, &usage
	if err := cmd.Run(); err != nil {
		t.Fatalf("fiberd -h: %v\n%s", err, usage.String())
	}
	have := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(usage.String(), -1) {
		have[m[1]] = true
	}
	if len(have) < 10 {
		t.Fatalf("fiberd -h lists %d flags; the parse is wrong:\n%s", len(have), usage.String())
	}

	b, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	rowRE := regexp.MustCompile("^\\| `-([a-z0-9-]+)`")
	documented := map[string]bool{}
	for i, l := range strings.Split(string(b), "\n") {
		m := rowRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		documented[m[1]] = true
		if !have[m[1]] && !strings.Contains(l, "testhooks") {
			t.Errorf("docs/operations.md:%d documents -%s, which `fiberd -h` does not list", i+1, m[1])
		}
	}
	var missing []string
	for f := range have {
		if !documented[f] {
			missing = append(missing, "-"+f)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("docs/operations.md has no row \"| `-NAME` |\" for: %s", strings.Join(missing, " "))
	}
}

// TestRoutesDocumented: every route pkg/fiberd registers, on the API or the
// admin socket, is named in docs/api.md as `METHOD /path`.
func TestRoutesDocumented(t *testing.T) {
	root := repotest.Root(t)
	files, err := filepath.Glob(filepath.Join(root, "pkg", "fiberd", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	api, err := os.ReadFile(filepath.Join(root, "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`mux\.Handle(?:Func)?\("([A-Z]+ /[^"]*)"`)
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			n++
			if !bytes.Contains(api, []byte("`"+m[1]+"`")) {
				t.Errorf("docs/api.md does not name the route `%s` (%s)", m[1], filepath.Base(f))
			}
		}
	}
	if n < 5 {
		t.Fatalf("found %d routes in pkg/fiberd; the parse is wrong", n)
	}
}

// TestStaticChecks checks what is not run: relative links resolve; cluster
// and bench blocks pass `bash -n` and name only repository paths that
// exist; log lines quoted in `text logs` blocks are messages of the code.
func TestStaticChecks(t *testing.T) {
	root := repotest.Root(t)
	needTools(t, "bash")
	linkRE := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	pathRE := regexp.MustCompile(`(?:^|[\s="'(])((?:deploy|examples|hack|sdk|cmd|pkg|docs|test)/[A-Za-z0-9._/-]*[A-Za-z0-9_/-])`)
	msgRE := regexp.MustCompile(`\] "((?:[^"\\]|\\.)+)"`)
	var code string
	for _, doc := range documents(t, root) {
		src, blocks := readDoc(t, root, doc)
		inBlock := map[int]bool{}
		for _, b := range blocks {
			for l := b.start; l <= b.end; l++ {
				inBlock[l] = true
			}
		}
		for i, l := range strings.Split(src, "\n") {
			if inBlock[i+1] {
				continue
			}
			for _, m := range linkRE.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				target, _, _ = strings.Cut(target, "#")
				if _, err := os.Stat(filepath.Join(root, filepath.Dir(doc), target)); err != nil {
					t.Errorf("%s:%d: link %s does not resolve: %v", doc, i+1, m[1], err)
				}
			}
		}
		for _, b := range blocks {
			switch b.kind() {
			case "cluster", "bench", "long":
				body := strings.Join(b.body, "\n") + "\n"
				cmd := exec.Command("bash", "-n")
				cmd.Stdin = strings.NewReader(body)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("%s:%d: bash -n: %v\n%s", doc, b.start, err, out)
				}
				for j, l := range b.body {
					for _, m := range pathRE.FindAllStringSubmatch(l, -1) {
						if _, err := os.Stat(filepath.Join(root, m[1])); err != nil {
							t.Errorf("%s:%d: %s names %s, which is not in the repository", doc, b.start+1+j, b.kind(), m[1])
						}
					}
				}
			case "logs":
				if code == "" {
					code = goSources(t, root)
				}
				for j, l := range b.body {
					if strings.TrimSpace(l) == "" {
						continue
					}
					m := msgRE.FindStringSubmatch(l)
					if m == nil {
						t.Errorf("%s:%d: a logs line needs the klog form `... file.go:N] \"Message\" key=value`", doc, b.start+1+j)
						continue
					}
					if !strings.Contains(code, `"`+m[1]+`"`) {
						t.Errorf("%s:%d: no Go code under pkg/ or cmd/ logs %q", doc, b.start+1+j, m[1])
					}
				}
			}
		}
	}
}

// goSources is the text of every non-test Go file under pkg/ and cmd/.
func goSources(t *testing.T, root string) string {
	t.Helper()
	var all strings.Builder
	for _, dir := range []string{"pkg", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			all.Write(b)
			return nil
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
	}
	return all.String()
}
