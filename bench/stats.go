package main

import (
	"math"
	"slices"
	"time"
)

// Summary is the distribution of one set of samples, in milliseconds.
type Summary struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50Ms"`
	P90  float64 `json:"p90Ms"`
	P99  float64 `json:"p99Ms"`
	Min  float64 `json:"minMs"`
	Max  float64 `json:"maxMs"`
	Mean float64 `json:"meanMs"`
}

// Percentile is the nearest-rank p-th percentile (0 < p <= 100) of sorted
// samples: the smallest sample with at least p percent of the samples at or
// below it. It is NaN for no samples; p <= 0 gives the minimum.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}

// Summarize sorts a copy of ms and summarises it. No samples give a
// Summary with N 0 and NaN elsewhere, which the tables print as "-".
func Summarize(ms []float64) Summary {
	s := slices.Clone(ms)
	slices.Sort(s)
	out := Summary{N: len(s), P50: Percentile(s, 50), P90: Percentile(s, 90), P99: Percentile(s, 99),
		Min: math.NaN(), Max: math.NaN(), Mean: math.NaN()}
	if len(s) == 0 {
		return out
	}
	sum := 0.0
	for _, v := range s {
		sum += v
	}
	out.Min, out.Max, out.Mean = s[0], s[len(s)-1], sum/float64(len(s))
	return out
}

// Ms is d in milliseconds.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
