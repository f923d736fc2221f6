package docs

import (
	"encoding/base64"
	"fmt"
	"regexp"
	"strings"
)

// block is one fenced code block of a document.
type block struct {
	start, end int // lines of the opening and closing fence, 1-based
	lang       string
	attrs      map[string]string // words after the language: "cluster" -> "", "file=x" -> "x"
	body       []string          // the lines between the fences, indentation of the fence removed
}

// kind is what docs-check does with the block.
func (b block) kind() string {
	switch {
	case b.attrs["file"] != "":
		return "file"
	case b.lang == "sh" || b.lang == "bash" || b.lang == "shell":
		if _, ok := b.attrs["cluster"]; ok {
			return "cluster"
		}
		if _, ok := b.attrs["bench"]; ok {
			return "bench"
		}
		if _, ok := b.attrs["long"]; ok {
			return "long"
		}
		return "run"
	case b.lang == "text":
		if _, ok := b.attrs["logs"]; ok {
			return "logs"
		}
	}
	return "show"
}

var fenceRE = regexp.MustCompile("^( {0,3})(`{3,}|~{3,})(.*)$")

// parseBlocks finds the fenced code blocks of a CommonMark document. A
// block left open at the end of the document is an error, since everything
// after it would silently be code.
func parseBlocks(src string) ([]block, error) {
	lines := strings.Split(src, "\n")
	var out []block
	for i := 0; i < len(lines); i++ {
		m := fenceRE.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		indent, fence, info := len(m[1]), m[2], strings.TrimSpace(m[3])
		if fence[0] == '`' && strings.Contains(info, "`") {
			continue // an inline code span, not a fence
		}
		b := block{start: i + 1, attrs: map[string]string{}}
		if words := strings.Fields(info); len(words) > 0 {
			b.lang = words[0]
			for _, w := range words[1:] {
				k, v, _ := strings.Cut(w, "=")
				b.attrs[k] = v
			}
		}
		closed := false
		for i++; i < len(lines); i++ {
			l := lines[i]
			trimmed := strings.TrimLeft(l, " ")
			if len(l)-len(trimmed) <= 3 && strings.HasPrefix(trimmed, fence[:1]) &&
				strings.TrimRight(trimmed, fence[:1]+" \t") == "" &&
				len(strings.TrimRight(trimmed, " \t")) >= len(fence) {
				closed = true
				break
			}
			for n := 0; n < indent && strings.HasPrefix(l, " "); n++ {
				l = l[1:]
			}
			b.body = append(b.body, l)
		}
		if !closed {
			return nil, fmt.Errorf("line %d: code block never closed", b.start)
		}
		b.end = i + 1
		out = append(out, b)
	}
	return out, nil
}

// prologue is line 1 of every generated script: strict mode, the block
// marker, the file writer and the trap that reports a failing command with
// its line, which is the document's line.
const prologue = `set -eEuo pipefail; ` +
	`__docs_block() { printf '\n@@docs-check block %s\n' "$1"; }; ` +
	`__docs_file() { mkdir -p "$(dirname "$2")"; printf '%s' "$3" | base64 -d > "$2"; printf '\n@@docs-check wrote %s (block %s)\n' "$2" "$1"; }; ` +
	`trap '__docs_rc=$?; printf "\n@@docs-check failed line %s exit %s: %s\n" "$LINENO" "$__docs_rc" "$BASH_COMMAND"; exit $__docs_rc' ERR`

// script turns a document into a bash script whose line N is the
// document's line N: the run blocks' lines are kept, a file block becomes
// one command on its opening fence that writes it, and every other line is
// blank. So bash's $LINENO is the document's line.
func script(src string, blocks []block) (string, error) {
	lines := strings.Split(src, "\n")
	out := make([]string, len(lines))
	for _, b := range blocks {
		if b.start == 1 {
			return "", fmt.Errorf("line 1 opens a code block; docs-check needs line 1 for its prologue")
		}
		switch b.kind() {
		case "run":
			out[b.start-1] = fmt.Sprintf("__docs_block %d", b.start)
			copy(out[b.start:], b.body)
		case "file":
			content := strings.Join(b.body, "\n") + "\n"
			out[b.start-1] = fmt.Sprintf("__docs_file %d %s %s", b.start, shellQuote(b.attrs["file"]),
				shellQuote(base64.StdEncoding.EncodeToString([]byte(content))))
		}
	}
	out[0] = prologue
	return strings.Join(out, "\n") + "\n", nil
}

// shellQuote quotes s for bash, in single quotes.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

var (
	failedRE = regexp.MustCompile(`^@@docs-check failed line (\d+) exit (\d+): (.*)$`)
	blockRE  = regexp.MustCompile(`^@@docs-check (?:block|wrote .*\(block) (\d+)\)?$`)
)

// failure reads a document's output and describes where it failed: the
// line of the failing command, the command, its exit status and the output
// of its block (at most tail lines of it). Without a failing command (a
// document killed for its time), lastBlock is the line of the block that
// was running.
func failure(output string, tail int) (line, status, command, lastBlock string, blockOut []string) {
	var cur []string
	for _, l := range strings.Split(output, "\n") {
		if m := blockRE.FindStringSubmatch(l); m != nil {
			cur = nil
			if line == "" {
				lastBlock = m[1]
			}
			continue
		}
		if m := failedRE.FindStringSubmatch(l); m != nil {
			if line == "" {
				line, status, command, blockOut = m[1], m[2], m[3], cur
			}
			continue
		}
		cur = append(cur, l)
	}
	if line == "" {
		blockOut = cur
	}
	if len(blockOut) > tail {
		blockOut = blockOut[len(blockOut)-tail:]
	}
	return line, status, command, lastBlock, blockOut
}
