package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "app")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	var stdout, stderr bytes.Buffer
	code := run([]string{"-ref", "fiberd.local/app:dev", "-out", out, "-base", "-entrypoint", "/app,-x",
		"-dir", "/data:1777", "/app=" + bin}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.HasPrefix(stdout.String(), "fiberd.local/app:dev sha256:") {
		t.Errorf("printed %q, want the reference and digest", stdout.String())
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatal(err)
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-out", "x.tar", "/a=b"}, "-ref and -out"},
		{[]string{"-ref", "a/b:c", "-out", "x.tar"}, "no DEST=SRC"},
		{[]string{"-ref", "a/b:c", "-out", "x.tar", "/a"}, "DEST=SRC"},
		{[]string{"-ref", "a/b:c", "-out", "x.tar", "-dir", "/d:999", "/a=b"}, "octal"},
		{[]string{"-ref", "a/b:c", "-out", "x.tar", "-env", "NOEQ", "/a=b"}, "KEY=VALUE"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: exit %d, %q; want 2 naming %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}
