package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// trailingGrants returns, every step milliseconds from 1 s on, the tokens
// granted in the preceding second.
func trailingGrants(bins []int64, step int) plotter.XYs {
	const width = 1000
	var pts plotter.XYs
	for end := width; end <= len(bins); end += step {
		var n int64
		for _, v := range bins[end-width : end] {
			n += v
		}
		pts = append(pts, plotter.XY{X: float64(end) / 1000, Y: float64(n)})
	}
	return pts
}

// trailingCalls returns, for each sample from 1 s on, the calls made in
// the preceding second (at least 1, for a log scale).
func trailingCalls(samples []point) plotter.XYs {
	var pts plotter.XYs
	j := 0
	for _, s := range samples {
		if s.at < time.Second {
			continue
		}
		for samples[j+1].at <= s.at-time.Second {
			j++
		}
		n := float64(s.n-samples[j].n) / (s.at - samples[j].at).Seconds()
		pts = append(pts, plotter.XY{X: s.at.Seconds(), Y: max(1, n)})
	}
	return pts
}

// plotLow draws, for the runs of one workload, the tokens granted and the
// Redis calls made per second over time, one line per implementation, and
// writes a PNG to path. goroutines is the callers per replica.
func plotLow(path string, runs []result, goroutines int) error {
	w, end := runs[0].w, runs[0].d.Seconds()
	granted := plot.New()
	granted.Title.Text = fmt.Sprintf("Limit %.0f/s, burst %d: %d replicas × %d goroutines calling Wait",
		w.rate, w.burst, len(runs[0].t.perReplica), goroutines)
	granted.Y.Label.Text = "tokens granted in the last second"
	granted.X.Min, granted.X.Max = 1, end
	granted.Add(plotter.NewGrid())
	limit, err := plotter.NewLine(plotter.XYs{{X: 1, Y: w.rate}, {X: end, Y: w.rate}})
	if err != nil {
		return err
	}
	limit.Color, limit.Width = color.Gray{Y: 170}, vg.Points(5)
	granted.Add(limit)
	granted.Legend.Add(fmt.Sprintf("limit %.0f/s", w.rate), limit)
	granted.Legend.Top = true

	calls := plot.New()
	calls.Y.Label.Text = "Redis calls in the last second"
	calls.X.Label.Text = "time since start (s)"
	calls.Y.Scale, calls.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	calls.X.Min, calls.X.Max = 1, end
	calls.Add(plotter.NewGrid())

	for i, r := range runs {
		for _, p := range []struct {
			plot *plot.Plot
			xys  plotter.XYs
		}{{granted, trailingGrants(r.t.bins, 50)}, {calls, trailingCalls(r.t.calls)}} {
			l, err := plotter.NewLine(p.xys)
			if err != nil {
				return err
			}
			l.Color, l.Dashes, l.Width = plotutil.Color(i), plotutil.Dashes(i), vg.Points(1.5)
			p.plot.Add(l)
			if p.plot == granted {
				granted.Legend.Add(r.im.name, l)
			}
		}
	}

	// Room at the top for the legend, and decades on the log scale.
	granted.Y.Min = min(granted.Y.Min, 0.8*w.rate)
	granted.Y.Max = max(granted.Y.Max, 1.2*w.rate)
	granted.Y.Max += (granted.Y.Max - granted.Y.Min) * 0.6
	calls.Y.Min = math.Pow(10, math.Floor(math.Log10(calls.Y.Min)))
	calls.Y.Max = math.Pow(10, math.Ceil(math.Log10(calls.Y.Max)))

	img := vgimg.New(9*vg.Inch, 7*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter, PadY: 3 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	canvases := plot.Align([][]*plot.Plot{{granted}, {calls}}, tiles, dc)
	granted.Draw(canvases[0][0])
	calls.Draw(canvases[1][0])

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
