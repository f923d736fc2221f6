package grant

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"

	"fiberd.io/fiberd/pkg/core"
)

// MaxTokenSize is the largest grant token accepted, core.MaxTokenSize
// (8 KiB). Longer tokens are refused before any decoding.
const MaxTokenSize = core.MaxTokenSize

// algorithms is the allow-list of signature algorithms: EdDSA (Ed25519) and
// ES256 (ECDSA P-256, SHA-256). Tokens with any other alg, "none", HS* and
// RS* included, are refused before a key is looked up.
var algorithms = []jose.SignatureAlgorithm{jose.EdDSA, jose.ES256}

// maxUIDLength is the longest DNS-1123 label.
const maxUIDLength = 63

// maxTemplateName is the longest template name before "@sha256:".
const maxTemplateName = 128

// header is the part of the protected JOSE header checked before go-jose
// parses the token, so the refusal names its reason.
type header struct {
	Alg string `json:"alg"`
	Kid string `json:"kid"`
}

// compactParts splits a compact JWS into its three base64url parts. It
// refuses anything over MaxTokenSize first.
func compactParts(token []byte) (hdr, payload, sig []byte, err error) {
	if len(token) > MaxTokenSize {
		return nil, nil, nil, fmt.Errorf("token size %d bytes is over the limit of %d", len(token), MaxTokenSize)
	}
	if len(token) == 0 {
		return nil, nil, nil, errors.New("token is empty")
	}
	parts := bytes.Split(token, []byte("."))
	if len(parts) != 3 {
		return nil, nil, nil, fmt.Errorf("token has %d dot-separated parts, want 3 (JWS compact serialisation)", len(parts))
	}
	return parts[0], parts[1], parts[2], nil
}

// decodeSegment decodes one unpadded base64url part of a compact JWS.
func decodeSegment(name string, seg []byte) ([]byte, error) {
	out := make([]byte, base64.RawURLEncoding.DecodedLen(len(seg)))
	n, err := base64.RawURLEncoding.Decode(out, seg)
	if err != nil {
		return nil, fmt.Errorf("%s is not unpadded base64url: %v", name, err)
	}
	return out[:n], nil
}

// parseHeader decodes and checks the protected header: alg on the
// allow-list, kid present.
func parseHeader(seg []byte) (header, error) {
	raw, err := decodeSegment("header", seg)
	if err != nil {
		return header{}, err
	}
	m, err := members(raw)
	if err != nil {
		return header{}, fmt.Errorf("header: %v", err)
	}
	var h header
	if err := stringMember(m, "alg", &h.Alg); err != nil {
		return header{}, fmt.Errorf("header: %v", err)
	}
	if err := stringMember(m, "kid", &h.Kid); err != nil {
		return header{}, fmt.Errorf("header: %v", err)
	}
	if h.Alg == "" {
		return header{}, errors.New("header has no alg")
	}
	if !algorithmAllowed(h.Alg) {
		return header{}, fmt.Errorf("algorithm %s not allowed (want EdDSA or ES256)", printable(h.Alg))
	}
	if h.Kid == "" {
		return header{}, errors.New("header has no kid")
	}
	if raw, ok := m["crit"]; ok {
		return header{}, critError(raw)
	}
	return h, nil
}

// maxCritNamed is how many crit names a refusal lists before "and N more".
const maxCritNamed = 4

// critError is the refusal of a header carrying crit: this verifier
// understands no JWS extension (RFC 7515 4.1.11), so every critical one is
// unsupported, and the error names them (each shortened and escaped).
func critError(raw json.RawMessage) error {
	var names []string
	if err := json.Unmarshal(raw, &names); err != nil {
		return errors.New("header: crit is not a list of names")
	}
	if len(names) == 0 {
		return errors.New("header: crit is empty (RFC 7515 forbids an empty list)")
	}
	shown := make([]string, 0, maxCritNamed)
	for _, n := range names[:min(len(names), maxCritNamed)] {
		shown = append(shown, printable(n))
	}
	list := strings.Join(shown, ", ")
	if more := len(names) - len(shown); more > 0 {
		list += fmt.Sprintf(" and %d more", more)
	}
	if len(names) == 1 {
		return fmt.Errorf("header: critical header extension %s is not supported", list)
	}
	return fmt.Errorf("header: critical header extensions %s are not supported", list)
}

func algorithmAllowed(alg string) bool {
	return slices.Contains(algorithms, jose.SignatureAlgorithm(alg))
}

// members reads a JSON object into its members by exact name. Duplicate
// names, trailing data and anything but an object are refused. Unlike
// decoding into a struct, names match case-sensitively.
func members(data []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("not a JSON object: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not a JSON object")
	}
	m := make(map[string]json.RawMessage)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("bad JSON object: %v", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, errors.New("bad JSON object: member name is not a string")
		}
		if _, dup := m[name]; dup {
			return nil, fmt.Errorf("member %s appears twice", quoted(name))
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("member %s: %v", quoted(name), err)
		}
		m[name] = v
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, fmt.Errorf("bad JSON object: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON object")
	}
	return m, nil
}

// onlyMembers refuses any member of m not in allowed.
func onlyMembers(where string, m map[string]json.RawMessage, allowed ...string) error {
	for name := range m {
		if !slices.Contains(allowed, name) {
			return fmt.Errorf("%s has unknown member %s", where, quoted(name))
		}
	}
	return nil
}

// stringMember sets *dst to the string member name of m, leaving it alone
// when the member is absent.
func stringMember(m map[string]json.RawMessage, name string, dst *string) error {
	raw, ok := m[name]
	if !ok {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return fmt.Errorf("%s is not a string", name)
	}
	return nil
}

// numericDate reads a JWT NumericDate: seconds since the epoch, an integer
// or a fraction, non-negative.
func numericDate(m map[string]json.RawMessage, name string) (time.Time, bool, error) {
	raw, ok := m[name]
	if !ok {
		return time.Time{}, false, nil
	}
	var num json.Number
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&num); err != nil {
		return time.Time{}, true, fmt.Errorf("%s is not a number", name)
	}
	if sec, err := num.Int64(); err == nil {
		if sec < 0 || sec > maxNumericDate {
			return time.Time{}, true, fmt.Errorf("%s %d is out of range", name, sec)
		}
		return time.Unix(sec, 0).UTC(), true, nil
	}
	f, err := num.Float64()
	if err != nil || math.IsNaN(f) || f < 0 || f > maxNumericDate {
		return time.Time{}, true, fmt.Errorf("%s %s is not a valid date", name, num)
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC(), true, nil
}

// maxNumericDate bounds dates to the year 9999 or so, far beyond any lease,
// so arithmetic on them cannot overflow a time.Duration in odd ways.
const maxNumericDate = 253402300799

// ValidUID reports whether s is a grant UID: a DNS-1123 label, 1 to 63
// characters of lowercase letters, digits and '-', starting and ending with a
// letter or digit. A Kubernetes Pod UID qualifies. The error says what is
// wrong and names s shortened and escaped (printable), never whole: s may
// come from an untrusted request.
func ValidUID(s string) error {
	if s == "" {
		return errors.New("uid is empty")
	}
	if len(s) > maxUIDLength {
		return fmt.Errorf("uid is %d characters, over the DNS-1123 label limit of %d", len(s), maxUIDLength)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' && i > 0 && i < len(s)-1:
		default:
			return fmt.Errorf("uid %s is not a DNS-1123 label (lowercase letters, digits and inner '-')", printable(s))
		}
	}
	return nil
}

// ValidTemplate reports whether s names a template as a grant does:
// "name@sha256:<64 lowercase hex>", where name is 1 to 128 characters of
// lowercase letters, digits, '.', '_' and '-', starting and ending with a
// letter or digit. The error says what is wrong.
func ValidTemplate(s string) error {
	name, digest, ok := cutLast(s, "@sha256:")
	if !ok {
		return fmt.Errorf("template %q is not name@sha256:<64 hex>", s)
	}
	if name == "" || len(name) > maxTemplateName {
		return fmt.Errorf("template %q: name must be 1 to %d characters", s, maxTemplateName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '-' || c == '.' || c == '_') && i > 0 && i < len(name)-1:
		default:
			return fmt.Errorf("template %q: name may hold lowercase letters, digits and inner '.', '_', '-'", s)
		}
	}
	if len(digest) != 64 {
		return fmt.Errorf("template %q: digest must be 64 lowercase hex characters", s)
	}
	for i := 0; i < len(digest); i++ {
		c := digest[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("template %q: digest must be 64 lowercase hex characters", s)
		}
	}
	return nil
}

// printable returns s as is when it is a short plain word, and quoted and
// cut to 32 bytes otherwise, so untrusted header values stay readable in
// errors and logs.
func printable(s string) string {
	if len(s) <= 32 {
		plain := true
		for i := 0; i < len(s); i++ {
			c := s[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				plain = false
				break
			}
		}
		if plain && s != "" {
			return s
		}
	}
	if len(s) > 32 {
		s = s[:32]
	}
	return strconv.Quote(s)
}

// quoted returns s quoted, cut to 32 bytes first (marked "..."), for
// member names an untrusted token chose.
func quoted(s string) string {
	if len(s) > 32 {
		return strconv.Quote(s[:32]) + "..."
	}
	return strconv.Quote(s)
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// PeekUID returns the jti of a grant token without verifying anything else:
// it lets a lane name a grant before the agent verifies it, and must never be
// trusted for more. The size cap is checked first; anything that is not a
// three-part compact JWS whose payload is a JSON object with a DNS-1123 jti
// is an error wrapping core.ErrInvalid. It never panics, whatever the input.
func PeekUID(token []byte) (string, error) {
	_, payload, _, err := compactParts(token)
	if err != nil {
		return "", fmt.Errorf("grant token: %v: %w", err, core.ErrInvalid)
	}
	raw, err := decodeSegment("payload", payload)
	if err != nil {
		return "", fmt.Errorf("grant token: %v: %w", err, core.ErrInvalid)
	}
	m, err := members(raw)
	if err != nil {
		return "", fmt.Errorf("grant token: payload: %v: %w", err, core.ErrInvalid)
	}
	var uid string
	if err := stringMember(m, "jti", &uid); err != nil {
		return "", fmt.Errorf("grant token: %v: %w", err, core.ErrInvalid)
	}
	if err := ValidUID(uid); err != nil {
		return "", fmt.Errorf("grant token: jti: %v: %w", err, core.ErrInvalid)
	}
	return uid, nil
}

// claims is what a token's payload says, before the checks that need the
// verifier's configuration.
type claims struct {
	g      core.Grant
	aud    []string
	hasNbf bool
	nbf    time.Time
}

// parseClaims decodes the payload strictly enough that every core.Grant
// field is well formed. Unknown top-level members are ignored (they are
// registered or public claims this package does not use); unknown members
// of "grant" are refused.
func parseClaims(payload []byte) (claims, error) {
	var c claims
	m, err := members(payload)
	if err != nil {
		return c, fmt.Errorf("payload: %v", err)
	}
	if err := stringMember(m, "jti", &c.g.UID); err != nil {
		return c, err
	}
	if err := ValidUID(c.g.UID); err != nil {
		return c, fmt.Errorf("jti: %v", err)
	}
	if err := stringMember(m, "iss", &c.g.Issuer); err != nil {
		return c, err
	}
	if c.g.Issuer == "" {
		return c, errors.New("iss is missing")
	}
	if raw, ok := m["aud"]; ok {
		var one string
		if err := json.Unmarshal(raw, &one); err == nil {
			c.aud = []string{one}
		} else if err := json.Unmarshal(raw, &c.aud); err != nil {
			return c, errors.New("aud is neither a string nor an array of strings")
		}
	}
	var ok bool
	if c.g.IssuedAt, ok, err = numericDate(m, "iat"); err != nil {
		return c, err
	} else if !ok {
		return c, errors.New("iat is missing")
	}
	if c.g.Expiry, ok, err = numericDate(m, "exp"); err != nil {
		return c, err
	} else if !ok {
		return c, errors.New("exp is missing")
	}
	if !c.g.Expiry.After(c.g.IssuedAt) {
		return c, fmt.Errorf("exp %d is not after iat %d", c.g.Expiry.Unix(), c.g.IssuedAt.Unix())
	}
	if c.nbf, c.hasNbf, err = numericDate(m, "nbf"); err != nil {
		return c, err
	}
	raw, ok := m["grant"]
	if !ok {
		return c, errors.New(`claim "grant" is missing`)
	}
	if err := parseGrantClaim(raw, &c.g); err != nil {
		return c, fmt.Errorf(`claim "grant": %v`, err)
	}
	return c, nil
}

// grantClaim is the private claim's wire form. It is used with
// DisallowUnknownFields after members has refused unknown and miscased
// names, so both layers agree.
type grantClaim struct {
	Template string       `json:"template"`
	Fibers   *fibersClaim `json:"fibers"`
	WBudget  int64        `json:"wBudget,omitempty"`
	MinTier  string       `json:"minTier,omitempty"`
	Devices  *deviceClaim `json:"devices,omitempty"`
}

type fibersClaim struct {
	Max  int `json:"max"`
	Warm int `json:"warm,omitempty"`
}

type deviceClaim struct {
	Class string `json:"class"`
	Count int    `json:"count"`
}

// parseGrantClaim decodes and checks the private "grant" claim into g.
func parseGrantClaim(raw []byte, g *core.Grant) error {
	m, err := members(raw)
	if err != nil {
		return err
	}
	if err := onlyMembers("grant", m, "template", "fibers", "wBudget", "minTier", "devices"); err != nil {
		return err
	}
	if f, ok := m["fibers"]; ok {
		fm, err := members(f)
		if err != nil {
			return fmt.Errorf("fibers: %v", err)
		}
		if err := onlyMembers("fibers", fm, "max", "warm"); err != nil {
			return err
		}
		if _, ok := fm["max"]; !ok {
			return errors.New("fibers.max is missing")
		}
	}
	if d, ok := m["devices"]; ok {
		dm, err := members(d)
		if err != nil {
			return fmt.Errorf("devices: %v", err)
		}
		if err := onlyMembers("devices", dm, "class", "count"); err != nil {
			return err
		}
	}
	var gc grantClaim
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&gc); err != nil {
		return err
	}
	if err := ValidTemplate(gc.Template); err != nil {
		return err
	}
	if gc.Fibers == nil {
		return errors.New("fibers is missing")
	}
	if gc.Fibers.Max < 1 {
		return fmt.Errorf("fibers.max %d is below 1", gc.Fibers.Max)
	}
	if gc.Fibers.Warm < 0 || gc.Fibers.Warm > gc.Fibers.Max {
		return fmt.Errorf("fibers.warm %d is outside 0..fibers.max (%d)", gc.Fibers.Warm, gc.Fibers.Max)
	}
	if gc.WBudget < 0 {
		return fmt.Errorf("wBudget %d is negative", gc.WBudget)
	}
	tier, err := core.ParseTier(gc.MinTier)
	if err != nil {
		return fmt.Errorf("minTier: %v", err)
	}
	var dev core.DeviceRequest
	if gc.Devices != nil {
		dev = core.DeviceRequest{Class: gc.Devices.Class, Count: gc.Devices.Count}
		if err := validDevices(dev); err != nil {
			return err
		}
	}
	g.Template = gc.Template
	g.Fibers = core.Fibers{Max: gc.Fibers.Max, Warm: gc.Fibers.Warm}
	g.WBudget = gc.WBudget
	g.MinTier = tier
	g.Devices = dev
	return nil
}

// validDevices accepts the zero request, or a class with a count of at
// least 1.
func validDevices(d core.DeviceRequest) error {
	switch {
	case d.Count < 0:
		return fmt.Errorf("devices.count %d is negative", d.Count)
	case d.Count > 0 && d.Class == "":
		return errors.New("devices.class is empty but devices.count is set")
	case d.Count == 0 && d.Class != "":
		return fmt.Errorf("devices.class %q asks for a count of 0", d.Class)
	}
	return nil
}
