package fiberd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"strings"
	"sync"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
)

// readBody reads a request body of at most api.MaxRequestBody bytes. A
// declared Content-Length over the cap is refused before a byte is read;
// an undeclared one is cut by http.MaxBytesReader at the cap. Both wrap
// errBodyTooLarge. The body must arrive within the read deadline deadlines set
// (Limits.BodyTimeout), else errBodyTimeout (408). Once the body is read
// whole, net/http's background read of the connection starts and lifts that
// deadline itself, so a long Clone keeps its context
// (TestLongCloneOutlivesBodyTimeout holds it to that). On any failure the
// connection is closed after the answer.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > api.MaxRequestBody {
		w.Header().Set("Connection", "close")
		return nil, fmt.Errorf("request body of %d bytes is over the limit of %d: %w", r.ContentLength, api.MaxRequestBody, errBodyTooLarge)
	}
	body := http.MaxBytesReader(w, r.Body, api.MaxRequestBody)
	b, err := io.ReadAll(body)
	if err != nil {
		w.Header().Set("Connection", "close")
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, fmt.Errorf("request body is over the limit of %d bytes: %w", api.MaxRequestBody, errBodyTooLarge)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("%w: read %d bytes before the deadline", errBodyTimeout, len(b))
		}
		return nil, fmt.Errorf("reading the request body: %v: %w", err, core.ErrInvalid)
	}
	return b, nil
}

// decodeStrict decodes data, one JSON object, into v, a pointer to a
// struct. It is stricter than encoding/json: member names must match a
// field's json name exactly (not case-insensitively) and appear once, at
// every depth; unknown members and trailing data are refused. Errors wrap
// core.ErrInvalid.
func decodeStrict(data []byte, v any) error {
	if err := checkMembers(data, reflect.TypeOf(v).Elem(), ""); err != nil {
		return fmt.Errorf("request body: %v: %w", err, core.ErrInvalid)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("request body: %v: %w", err, core.ErrInvalid)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("request body: trailing data after the JSON object: %w", core.ErrInvalid)
	}
	return nil
}

// checkMembers walks the JSON value data against type t: for a struct
// every member must be one of its json names, exactly and once, and is
// checked against its field's type; slices and maps check their elements.
// Other kinds are left to encoding/json.
func checkMembers(data []byte, t reflect.Type, where string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	trimmed := bytes.TrimSpace(data)
	if bytes.Equal(trimmed, []byte("null")) {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		if t.PkgPath() == "time" { // time.Time decodes from a string
			return nil
		}
		m, err := objectMembers(trimmed)
		if err != nil {
			return fmt.Errorf("%s: %v", nameOr(where), err)
		}
		fields := jsonFields(t)
		for name, raw := range m {
			ft, ok := fields[name]
			if !ok {
				return fmt.Errorf("%s: unknown member %q", nameOr(where), name)
			}
			if err := checkMembers(raw, ft, join(where, name)); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 { // []byte is base64
			return nil
		}
		var elems []json.RawMessage
		if err := json.Unmarshal(trimmed, &elems); err != nil {
			return fmt.Errorf("%s: want a JSON array", nameOr(where))
		}
		for i, e := range elems {
			if err := checkMembers(e, t.Elem(), fmt.Sprintf("%s[%d]", where, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		var m map[string]json.RawMessage
		if err := json.Unmarshal(trimmed, &m); err != nil {
			return fmt.Errorf("%s: want a JSON object", nameOr(where))
		}
		for k, e := range m {
			if err := checkMembers(e, t.Elem(), join(where, k)); err != nil {
				return err
			}
		}
	}
	return nil
}

// objectMembers reads a JSON object into its members in one pass,
// refusing anything but a single object and a member named twice.
func objectMembers(obj []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("want a JSON object")
	}
	m := make(map[string]json.RawMessage)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, errors.New("want a JSON object")
		}
		name, _ := tok.(string)
		if _, dup := m[name]; dup {
			return nil, fmt.Errorf("member %q appears twice", name)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, errors.New("want a JSON object")
		}
		m[name] = v
	}
	if _, err := dec.Token(); err != nil { // '}'
		return nil, errors.New("want a JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("want a JSON object")
	}
	return m, nil
}

// fieldCache holds jsonFields' answer per struct type: the request types
// are few and fixed, so each is reflected on once, not per request.
var fieldCache sync.Map // reflect.Type -> map[string]reflect.Type

// jsonFields maps a struct's json member names to their field types. The
// map is shared: callers only read it.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	out := make(map[string]reflect.Type, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name := f.Name
		if tag, ok := f.Tag.Lookup("json"); ok {
			n, _, _ := strings.Cut(tag, ",")
			if n == "-" {
				continue
			}
			if n != "" {
				name = n
			}
		}
		out[name] = f.Type
	}
	fieldCache.Store(t, out)
	return out
}

func join(where, name string) string {
	if where == "" {
		return name
	}
	return where + "." + name
}

func nameOr(where string) string {
	if where == "" {
		return "body"
	}
	return where
}
