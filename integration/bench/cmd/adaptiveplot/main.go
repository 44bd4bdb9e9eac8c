// Command adaptiveplot draws the per-second deliveries of the adaptive rate's
// hidden-limit scenario (adaptive off and on, through the binary) from the
// measured series in adaptive-series.txt, with the provider's hidden limit,
// and prints each series' mean over the measurement window. It measures
// nothing itself: the series come from
//
//	THROTTLE_SIM=1 go test -count=1 -run TestAdaptiveHiddenLimitE2E -v ./integration/
//
// Run it from integration/bench:
//
//	go run ./cmd/adaptiveplot            # reads adaptive-series.txt, writes adaptive.png
package main

import (
	"bufio"
	"flag"
	"fmt"
	"image/color"
	"os"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

type series struct {
	label  string
	perSec []float64 // perSec[i]: delivered in second i
}

type data struct {
	limit    float64
	from, to int // measurement window, seconds
	series   []series
}

func main() {
	in := flag.String("in", "adaptive-series.txt", "measured series to read")
	out := flag.String("out", "adaptive.png", "PNG to write")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "adaptiveplot:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	d, err := read(in)
	if err != nil {
		return err
	}
	for _, s := range d.series {
		if len(s.perSec) < d.to {
			return fmt.Errorf("series %q: %d seconds, window ends at %d", s.label, len(s.perSec), d.to)
		}
		var n float64
		for _, v := range s.perSec[d.from:d.to] {
			n += v
		}
		fmt.Printf("%s: %.1f/s delivered over %d-%d s\n", s.label, n/float64(d.to-d.from), d.from, d.to)
	}
	return draw1(out, d)
}

// read parses the data file: '#' comments, "limit N", "window FROM TO",
// and "series LABEL = V0 V1 ...".
func read(path string) (data, error) {
	var d data
	f, err := os.Open(path)
	if err != nil {
		return d, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for line := 1; sc.Scan(); line++ {
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		key, rest, _ := strings.Cut(t, " ")
		var err error
		switch key {
		case "limit":
			d.limit, err = strconv.ParseFloat(strings.TrimSpace(rest), 64)
		case "window":
			_, err = fmt.Sscan(rest, &d.from, &d.to)
		case "series":
			label, vals, ok := strings.Cut(rest, " = ")
			if !ok {
				err = fmt.Errorf("want LABEL = VALUES")
				break
			}
			s := series{label: strings.TrimSpace(label)}
			for _, v := range strings.Fields(vals) {
				x, perr := strconv.ParseFloat(v, 64)
				if perr != nil {
					err = perr
					break
				}
				s.perSec = append(s.perSec, x)
			}
			d.series = append(d.series, s)
		default:
			err = fmt.Errorf("unknown key %q", key)
		}
		if err != nil {
			return d, fmt.Errorf("%s:%d: %w", path, line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return d, err
	}
	if len(d.series) == 0 || d.limit <= 0 || d.to <= d.from {
		return d, fmt.Errorf("%s: want a limit, a window and at least one series", path)
	}
	return d, nil
}

// draw1 writes the plot: one line per series (each second's deliveries
// drawn at the end of that second), the hidden limit as a wide grey line
// and the measurement window as two dotted vertical lines, in the style of
// plot.go's lowrate.png.
func draw1(path string, d data) error {
	end := 0
	for _, s := range d.series {
		end = max(end, len(s.perSec))
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("3 replicas at rate 100/s against a provider with a hidden limit of %.0f/s", d.limit)
	p.X.Label.Text = "time since the backlog was published (s)"
	p.Y.Label.Text = "messages delivered in the last second"
	p.X.Min, p.X.Max = 0, float64(end)
	p.Y.Min = 0
	p.Add(plotter.NewGrid())

	limit, err := plotter.NewLine(plotter.XYs{{X: 0, Y: d.limit}, {X: float64(end), Y: d.limit}})
	if err != nil {
		return err
	}
	limit.Color, limit.Width = color.Gray{Y: 170}, vg.Points(5)
	p.Add(limit)
	p.Legend.Add(fmt.Sprintf("provider's hidden limit %.0f/s", d.limit), limit)

	for i, s := range d.series {
		xys := make(plotter.XYs, len(s.perSec))
		for j, v := range s.perSec {
			xys[j] = plotter.XY{X: float64(j + 1), Y: v}
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		l.Color, l.Width = plotutil.Color(2*i), vg.Points(1.75) // red, blue
		p.Add(l)
		p.Legend.Add(s.label, l)
	}

	top := d.limit * 1.6
	p.Y.Max = top
	for _, x := range []int{d.from, d.to} {
		w, err := plotter.NewLine(plotter.XYs{{X: float64(x), Y: 0}, {X: float64(x), Y: top}})
		if err != nil {
			return err
		}
		w.Color, w.Width, w.Dashes = color.Black, vg.Points(0.75), []vg.Length{vg.Points(2), vg.Points(3)}
		p.Add(w)
		if x == d.from {
			p.Legend.Add(fmt.Sprintf("measured window %d-%d s", d.from, d.to), w)
		}
	}
	var ticks []plot.Tick
	for y := 0.0; y <= top; y += 5 {
		t := plot.Tick{Value: y}
		if int(y)%10 == 0 {
			t.Label = strconv.Itoa(int(y))
		}
		ticks = append(ticks, t)
	}
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	var xt []plot.Tick
	for x := 0; x <= end; x += 5 {
		t := plot.Tick{Value: float64(x)}
		if x%10 == 0 {
			t.Label = strconv.Itoa(x)
		}
		xt = append(xt, t)
	}
	p.X.Tick.Marker = plot.ConstantTicks(xt)
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.Padding = vg.Points(2)
	return p.Save(9*vg.Inch, 5*vg.Inch, path)
}
