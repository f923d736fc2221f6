package main

import (
	"bufio"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// sample is one line of the Prometheus text format: a metric name, its labels and its value.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseText reads the Prometheus text exposition format, keeping the samples whose name is one
// of names (all of them when names is empty). Comment lines are skipped; a line that does not
// parse is an error naming it, since a scrape that half-parses would give wrong rates.
func parseText(text string, names ...string) ([]sample, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var out []sample
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		nameEnd := strings.IndexAny(line, "{ ")
		if nameEnd <= 0 {
			return nil, fmt.Errorf("metrics line %q: no metric name", line)
		}
		name := line[:nameEnd]
		if len(want) > 0 && !want[name] {
			continue
		}
		s := sample{name: name, labels: map[string]string{}}
		rest := line[nameEnd:]
		if strings.HasPrefix(rest, "{") {
			end, err := parseLabels(rest, s.labels)
			if err != nil {
				return nil, fmt.Errorf("metrics line %q: %w", line, err)
			}
			rest = rest[end:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return nil, fmt.Errorf("metrics line %q: no value", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: value: %w", line, err)
		}
		s.value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

// parseLabels reads `{a="x",b="y"}` at the start of s into into, and returns the index just past
// the closing brace. Values may hold escaped quotes, backslashes and newlines.
func parseLabels(s string, into map[string]string) (int, error) {
	i := 1
	for {
		for i < len(s) && (s[i] == ',' || s[i] == ' ') {
			i++
		}
		if i >= len(s) {
			return 0, fmt.Errorf("labels not closed")
		}
		if s[i] == '}' {
			return i + 1, nil
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 {
			return 0, fmt.Errorf("label without '='")
		}
		key := s[i : i+eq]
		i += eq + 1
		if i >= len(s) || s[i] != '"' {
			return 0, fmt.Errorf("label %s: value not quoted", key)
		}
		i++
		var b strings.Builder
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(s[i])
				}
				continue
			}
			b.WriteByte(s[i])
		}
		if i >= len(s) {
			return 0, fmt.Errorf("label %s: value not closed", key)
		}
		into[key] = b.String()
		i++
	}
}

// requestKey is one row of the API server's request counts: verb and resource (with its
// subresource after a slash, "pods/status").
type requestKey struct {
	Verb     string
	Resource string
}

// String is "VERB resource".
func (k requestKey) String() string { return k.Verb + " " + k.Resource }

// requestCounts sums apiserver_request_total by verb and resource, over codes, scopes, groups
// and versions.
func requestCounts(samples []sample) map[requestKey]float64 {
	out := map[requestKey]float64{}
	for _, s := range samples {
		if s.name != "apiserver_request_total" {
			continue
		}
		r := s.labels["resource"]
		if sub := s.labels["subresource"]; sub != "" {
			r += "/" + sub
		}
		if r == "" {
			r = "(non-resource)"
		}
		out[requestKey{Verb: s.labels["verb"], Resource: r}] += s.value
	}
	return out
}

// rate is one row of a window's request rates.
type rate struct {
	Key    requestKey
	PerSec float64
}

// rates is (after - before) / seconds per key, the keys with no request in the window left out,
// highest rate first (then by key, so the order is stable).
func rates(before, after map[requestKey]float64, seconds float64) []rate {
	var out []rate
	for k, v := range after {
		d := v - before[k]
		if d <= 0 {
			continue
		}
		out = append(out, rate{Key: k, PerSec: d / seconds})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PerSec != out[j].PerSec {
			return out[i].PerSec > out[j].PerSec
		}
		return out[i].Key.String() < out[j].Key.String()
	})
	return out
}

// totalRate is the sum of rs.
func totalRate(rs []rate) float64 {
	t := 0.0
	for _, r := range rs {
		t += r.PerSec
	}
	return t
}

// histogram is one Prometheus histogram: cumulative counts by upper bound, its count and sum.
type histogram struct {
	bounds []float64 // ascending, +Inf last
	counts []float64 // cumulative, as exposed
	count  float64
	sum    float64
}

// histogramOf gathers the histogram name whose samples carry every label of match.
func histogramOf(samples []sample, name string, match map[string]string) histogram {
	var h histogram
	type bucket struct{ le, n float64 }
	var bs []bucket
	for _, s := range samples {
		if !matches(s.labels, match) {
			continue
		}
		switch s.name {
		case name + "_bucket":
			le, err := strconv.ParseFloat(s.labels["le"], 64)
			if err != nil {
				continue
			}
			bs = append(bs, bucket{le, s.value})
		case name + "_count":
			h.count += s.value
		case name + "_sum":
			h.sum += s.value
		}
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	for _, b := range bs {
		if n := len(h.bounds); n > 0 && h.bounds[n-1] == b.le {
			h.counts[n-1] += b.n
			continue
		}
		h.bounds = append(h.bounds, b.le)
		h.counts = append(h.counts, b.n)
	}
	return h
}

func matches(labels, match map[string]string) bool {
	for k, v := range match {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// minus is h's observations made since before (the same histogram scraped earlier).
func (h histogram) minus(before histogram) histogram {
	out := histogram{count: h.count - before.count, sum: h.sum - before.sum}
	for i, le := range h.bounds {
		n := h.counts[i]
		for j, ble := range before.bounds {
			if ble == le {
				n -= before.counts[j]
			}
		}
		out.bounds = append(out.bounds, le)
		out.counts = append(out.counts, n)
	}
	return out
}

// quantile estimates the q-quantile as Prometheus' histogram_quantile does: linear within the
// bucket that holds it, the lowest bucket starting at 0, and the highest finite bound when it
// falls in +Inf. NaN for an empty histogram.
func (h histogram) quantile(q float64) float64 {
	if h.count <= 0 || len(h.bounds) == 0 {
		return math.NaN()
	}
	rank := q * h.counts[len(h.counts)-1]
	for i, c := range h.counts {
		if c < rank {
			continue
		}
		if math.IsInf(h.bounds[i], 1) {
			if i == 0 {
				return math.NaN()
			}
			return h.bounds[i-1]
		}
		lo, below := 0.0, 0.0
		if i > 0 {
			lo, below = h.bounds[i-1], h.counts[i-1]
		}
		if c == below {
			return h.bounds[i]
		}
		return lo + (h.bounds[i]-lo)*(rank-below)/(c-below)
	}
	return h.bounds[len(h.bounds)-1]
}

// mean is sum / count, NaN when empty.
func (h histogram) mean() float64 {
	if h.count <= 0 {
		return math.NaN()
	}
	return h.sum / h.count
}

// gauge is the sum of the samples of name carrying every label of match.
func gauge(samples []sample, name string, match map[string]string) float64 {
	t := 0.0
	for _, s := range samples {
		if s.name == name && matches(s.labels, match) {
			t += s.value
		}
	}
	return t
}
