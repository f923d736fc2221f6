package docs

import (
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

func TestParseBlocks(t *testing.T) {
	tests := []struct {
		name  string
		src   string
		kinds []string
		err   bool
	}{
		{"run and show", "# t\n```sh\necho hi\n```\n```text\nhi\n```\n", []string{"run", "show"}, false},
		{"attributes", "# t\n```sh cluster\nkubectl get pods\n```\n```c file=a.c\nint x;\n```\n```text logs\nI0 x.go:1] \"m\"\n```\n```sh bench\ngo test\n```\n```sh long\nmake ci\n```\n", []string{"cluster", "file", "logs", "bench", "long"}, false},
		{"tilde and longer fences", "# t\n~~~bash\n```\n~~~\n````sh\n```\n````\n", []string{"run", "run"}, false},
		{"indented in a list", "# t\n- step\n  ```sh\n  echo hi\n  ```\n", []string{"run"}, false},
		{"inline code is no fence", "# t\n```a` b```\n", nil, false},
		{"unclosed", "# t\n```sh\necho hi\n", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			blocks, err := parseBlocks(tt.src)
			if (err != nil) != tt.err {
				t.Fatalf("err = %v, want error %v", err, tt.err)
			}
			var kinds []string
			for _, b := range blocks {
				kinds = append(kinds, b.kind())
			}
			if !reflect.DeepEqual(kinds, tt.kinds) {
				t.Errorf("kinds = %v, want %v", kinds, tt.kinds)
			}
		})
	}
}

// TestScriptReportsTheDocumentLine: the generated script keeps the
// document's line numbers, carries variables between blocks, writes file
// blocks, and a failing command is reported at its own line with the
// output of its block.
func TestScriptReportsTheDocumentLine(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("needs bash")
	}
	doc := strings.Join([]string{
		"# A document", // 1
		"",             // 2
		"```sh",        // 3
		"cd \"$(mktemp -d)\"",
		"X=hello",
		"```", // 6
		"Prose.",
		"```text file=greeting.txt", // 8
		"hello",
		"```",   // 10
		"```sh", // 11
		"test \"$(cat greeting.txt)\" = \"$X\"",
		"echo before-the-failure",
		"false",
		"echo never",
		"```",
	}, "\n")
	blocks, err := parseBlocks(doc)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := script(doc, blocks)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Count(sc, "\n"), strings.Count(doc, "\n")+1; got != want {
		t.Fatalf("script has %d lines, document %d", got, want)
	}
	out, err := exec.Command("bash", "-c", sc).CombinedOutput()
	if err == nil {
		t.Fatalf("script succeeded; want the failure at line 14:\n%s", out)
	}
	line, status, command, _, blockOut := failure(string(out), 10)
	if line != "14" || status != "1" || command != "false" {
		t.Errorf("failure at line %q exit %q command %q, want line 14 exit 1 false\n%s", line, status, command, out)
	}
	if !strings.Contains(strings.Join(blockOut, "\n"), "before-the-failure") || strings.Contains(string(out), "never") {
		t.Errorf("block output %q; want the failing block's output only\n%s", blockOut, out)
	}
}
