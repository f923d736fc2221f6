package main

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// writePlots renders the real-node comparison's distributions (a CDF), the
// latency distributions (a CDF and a box plot, log scale) and the closed
// loop into dir, and returns the files written.
func writePlots(dir string, r Result) ([]string, error) {
	var written []string
	var node []LatencyRow
	for _, x := range r.Node.Rows {
		if x.Measured && len(x.SamplesMs) > 0 {
			node = append(node, LatencyRow{Mode: x.Mode, SamplesMs: x.SamplesMs, Summary: x.Single})
		}
	}
	if len(node) > 0 {
		path := filepath.Join(dir, "node-cdf.png")
		if err := saveCDF("Real node: a worker's start to its first HTTP byte, cumulative distribution", node, path); err != nil {
			return nil, err
		}
		written = append(written, path)
	}
	var rows []LatencyRow
	for _, l := range r.Latency {
		if l.Measured && len(l.SamplesMs) > 0 {
			rows = append(rows, l)
		}
	}
	if len(rows) == 0 {
		return written, nil
	}

	path := filepath.Join(dir, "latency-cdf.png")
	if err := saveCDF("Clone to first HTTP byte: cumulative distribution", rows, path); err != nil {
		return nil, err
	}
	written = append(written, path)

	lo, hi := sampleRange(rows)
	box := plot.New()
	box.Title.Text = "Clone to first HTTP byte (box: quartiles; whiskers: 1.5 IQR)"
	box.Y.Label.Text = "milliseconds (log scale)"
	box.Y.Scale, box.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	var names []string
	for i, l := range rows {
		vals := make(plotter.Values, len(l.SamplesMs))
		for j, v := range l.SamplesMs {
			vals[j] = max(v, 1e-3)
		}
		b, err := plotter.NewBoxPlot(vg.Points(40), float64(i), vals)
		if err != nil {
			return nil, err
		}
		b.FillColor = plotutil.Color(i)
		box.Add(b)
		names = append(names, l.Mode)
	}
	box.NominalX(names...)
	box.Y.Min, box.Y.Max = lo/1.5, hi*1.5
	path = filepath.Join(dir, "latency-box.png")
	if err := box.Save(9*vg.Inch, 5*vg.Inch, path); err != nil {
		return nil, err
	}
	written = append(written, path)

	loop := plot.New()
	loop.Title.Text = "Closed loop: clones per second (clone, first byte, release)"
	loop.X.Label.Text = "concurrent callers"
	loop.Y.Label.Text = "clones per second (log scale)"
	loop.Y.Scale, loop.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	loop.Add(plotter.NewGrid())
	byMode := map[string]plotter.XYs{}
	var modes []string
	for _, x := range r.Loop {
		if !x.Measured || x.PerSecond <= 0 {
			continue
		}
		if _, ok := byMode[x.Mode]; !ok {
			modes = append(modes, x.Mode)
		}
		byMode[x.Mode] = append(byMode[x.Mode], plotter.XY{X: float64(x.Concurrency), Y: x.PerSecond})
	}
	if len(modes) > 0 {
		for i, m := range modes {
			l, pts, err := plotter.NewLinePoints(byMode[m])
			if err != nil {
				return nil, err
			}
			l.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
			loop.Add(l, pts)
			loop.Legend.Add(m, l, pts)
		}
		loop.Legend.Top = true
		path = filepath.Join(dir, "loop.png")
		if err := loop.Save(9*vg.Inch, 5*vg.Inch, path); err != nil {
			return nil, err
		}
		written = append(written, path)
	}
	return written, nil
}

// saveCDF plots the cumulative distribution of each row's samples (log
// scale) into path.
func saveCDF(title string, rows []LatencyRow, path string) error {
	cdf := plot.New()
	cdf.Title.Text = title
	cdf.X.Label.Text = "milliseconds (log scale)"
	cdf.Y.Label.Text = "fraction of samples at or below"
	cdf.X.Scale, cdf.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	cdf.Add(plotter.NewGrid())
	for i, l := range rows {
		s := slices.Clone(l.SamplesMs)
		slices.Sort(s)
		xys := make(plotter.XYs, len(s))
		for j, v := range s {
			xys[j] = plotter.XY{X: max(v, 1e-3), Y: float64(j+1) / float64(len(s))}
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		cdf.Add(line)
		cdf.Legend.Add(fmt.Sprintf("%s (p50 %s ms)", l.Mode, num(l.Summary.P50)), line)
	}
	cdf.Legend.Left, cdf.Legend.Top = true, true
	lo, hi := sampleRange(rows)
	cdf.X.Min, cdf.X.Max = lo/1.5, hi*1.5
	cdf.Y.Min, cdf.Y.Max = 0, 1.02
	return cdf.Save(9*vg.Inch, 5*vg.Inch, path)
}

// sampleRange is the smallest and largest sample of rows (at least 1 µs).
func sampleRange(rows []LatencyRow) (lo, hi float64) {
	lo, hi = math.Inf(1), 0
	for _, l := range rows {
		for _, v := range l.SamplesMs {
			lo, hi = min(lo, max(v, 1e-3)), max(hi, v)
		}
	}
	return lo, hi
}
