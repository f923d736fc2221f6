package main

// Untrusted strings: everything fiberctl prints that the agent sent (ids,
// endpoints, sessions, templates, scope, error messages) may hold what a
// terminal acts on instead of printing. fiberctl escapes it on the way
// out, in text and in JSON.

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// field is s as one printed field: as is when every character is
// printable and it holds no '"' or '\\', else Go-quoted (strconv.Quote),
// so a field is one unambiguous token on one line.
func field(s string) string {
	if !utf8.ValidString(s) || strings.ContainsAny(s, "\"\\") {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// escapeText is s with each character that is not printable (or a space)
// written as a Go escape (\x1b, \n, \u202e) and invalid UTF-8 as \xNN; the
// rest is left alone. For messages, where quoting the whole would hide
// their own quotes.
func escapeText(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsPrint(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRune(r) // 'x' with the escape inside
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}

// escapedError is an error whose message is printed through escapeText.
type escapedError struct{ err error }

func (e escapedError) Error() string { return escapeText(e.err.Error()) }
func (e escapedError) Unwrap() error { return e.err }

// jsonSafe rewrites encoded JSON (encoding/json's output) so every
// character that is not printable is a \u escape: encoding/json already
// escapes the C0 controls, but passes DEL, the C1 controls and format
// characters such as U+202E through raw. Outside strings JSON holds only
// printable ASCII and whitespace, which are kept; the decoded value is
// unchanged.
func jsonSafe(enc []byte) []byte {
	var b bytes.Buffer
	for i := 0; i < len(enc); {
		r, n := utf8.DecodeRune(enc[i:])
		switch {
		case r == '\n' || r == '\t' || r == '\r' || r == ' ' || (unicode.IsPrint(r) && !(r == utf8.RuneError && n <= 1)):
			b.Write(enc[i : i+n])
		case r == utf8.RuneError && n <= 1:
			b.WriteString(`\ufffd`) // not produced by encoding/json
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += n
	}
	return b.Bytes()
}
