package main

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Series is one sample of a Prometheus text exposition: its labels and
// value.
type Series struct {
	Labels map[string]string
	Value  float64
}

// ParseCounter returns every sample of the metric name in a Prometheus text
// exposition (version 0.0.4). Lines of other metrics, comments and blank
// lines are skipped; a malformed sample line of name is an error.
func ParseCounter(doc []byte, name string) ([]Series, error) {
	var out []Series
	sc := bufio.NewScanner(bytes.NewReader(doc))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		s := Series{Labels: map[string]string{}}
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				return nil, fmt.Errorf("%s: unterminated labels in %q", name, line)
			}
			if err := parseLabels(rest[1:end], s.Labels); err != nil {
				return nil, fmt.Errorf("%s: %w in %q", name, err, line)
			}
			rest = rest[end+1:]
		}
		f := strings.Fields(rest)
		if len(f) < 1 {
			return nil, fmt.Errorf("%s: no value in %q", name, line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("%s: value in %q: %w", name, line, err)
		}
		s.Value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

// parseLabels reads `a="x",b="y"` into m, unescaping \\, \" and \n.
func parseLabels(s string, m map[string]string) error {
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return fmt.Errorf("malformed label")
		}
		key := strings.TrimSpace(s[:eq])
		var val strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[i])
				}
				continue
			}
			val.WriteByte(s[i])
		}
		if i >= len(s) {
			return fmt.Errorf("unterminated label value")
		}
		m[key] = val.String()
		s = strings.TrimPrefix(strings.TrimSpace(s[i+1:]), ",")
		s = strings.TrimSpace(s)
	}
	return nil
}

// RequestCounts sums apiserver_request_total samples by "VERB resource"
// (with "/subresource" when there is one), keeping only the resources in
// keep (all when keep is empty).
func RequestCounts(series []Series, keep ...string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range series {
		res := s.Labels["resource"]
		if len(keep) > 0 && !slices.Contains(keep, res) {
			continue
		}
		if sub := s.Labels["subresource"]; sub != "" {
			res += "/" + sub
		}
		out[s.Labels["verb"]+" "+res] += s.Value
	}
	return out
}

// Delta is after minus before, per key, leaving out keys that did not
// change.
func Delta(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if d := after[k] - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// IsWrite reports whether an apiserver_request_total verb changes state.
func IsWrite(verb string) bool {
	switch verb {
	case "GET", "LIST", "WATCH", "CONNECT":
		return false
	}
	return true
}
