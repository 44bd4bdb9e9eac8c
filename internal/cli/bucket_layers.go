package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// layersOf returns the layered store of cfg's bucket on client, or nil when
// cfg has no limit.extra.
func layersOf(client redis.UniversalClient, cfg *config.Config) (*redislimiter.Layered, error) {
	if len(cfg.Limit.Extra) == 0 {
		return nil, nil
	}
	layers, err := cfg.Limit.Layers()
	if err != nil {
		return nil, err
	}
	s, err := redislimiter.New(client, redislimiter.Config{Bucket: cfg.Limit.Bucket, Rate: cfg.Limit.Rate, Burst: cfg.Limit.Burst})
	if err != nil {
		return nil, err
	}
	return s.WithLayers(layers)
}

// layerStatusJSON is the state of one key of a layer, for --json.
type layerStatusJSON struct {
	Bucket string  `json:"bucket"`
	Layer  string  `json:"layer"`
	Key    string  `json:"key,omitempty"`
	Kind   string  `json:"kind"` // "bucket", "quota", "concurrency", "budget" or "window"
	Rate   float64 `json:"rate,omitempty"`
	// Concurrency is set for a concurrency layer, whose Used is the
	// slots held now.
	Concurrency int        `json:"concurrency,omitempty"`
	Burst       int        `json:"burst,omitempty"`
	Tokens      *float64   `json:"tokens,omitempty"`
	Quota       int        `json:"quota,omitempty"`
	Per         string     `json:"per,omitempty"`
	Timezone    string     `json:"timezone,omitempty"`
	Used        *int       `json:"used,omitempty"`
	WindowEnd   *time.Time `json:"window_end,omitempty"`
	// Budget, Spent and Left are a budget's, in its currency.
	Budget *float64 `json:"budget,omitempty"`
	Spent  *float64 `json:"spent,omitempty"`
	Left   *float64 `json:"left,omitempty"`
	// Open, Opens and Closes are a window's for the key: whether it is
	// open now, and the open interval that holds now or comes next.
	Open   *bool      `json:"open,omitempty"`
	Opens  *time.Time `json:"opens,omitempty"`
	Closes *time.Time `json:"closes,omitempty"`
	Full   bool       `json:"full"`
}

// cmdBucketLayer runs `bucket status|reset [NAME] --config FILE --layer L
// [--key K]`: one key of one layer of limit.extra.
func cmdBucketLayer(ctx context.Context, sub, name, cfgPath, addr, layer, key string, asJSON bool, stdout io.Writer, help string) error {
	switch {
	case cfgPath == "":
		return usagef(help, "--layer needs --config FILE: the layers are those of its limit.extra")
	case layer == "":
		return usagef(help, "--key needs --layer")
	}
	t, err := openBucket(name, cfgPath, addr, help)
	if err != nil {
		return err
	}
	defer t.client.Close()
	cfg, err := loadConfig(cfgPath)
	if err != nil {
		return err
	}
	if t.name != cfg.Limit.Bucket {
		return usagef(help, "--layer: bucket %s is not limit.bucket of %s (%s)", t.name, cfgPath, cfg.Limit.Bucket)
	}
	ls, err := layersOf(t.client, cfg)
	if err != nil {
		return &configError{err: err}
	}
	var names []string
	for _, x := range cfg.Limit.Extra {
		names = append(names, x.Name)
	}
	if ls == nil {
		return usagef(help, "--layer: %s has no limit.extra", cfgPath)
	}
	l, err := ls.Layer(layer)
	if err != nil {
		return usagef(help, "--layer: no layer %q in limit.extra of %s (it has %s)", layer, cfgPath, strings.Join(names, ", "))
	}
	switch {
	case l.Keyed && key == "":
		return usagef(help, "layer %s has a key per message: give --key", layer)
	case !l.Keyed && key != "":
		return usagef(help, "layer %s has no key (no key template): drop --key", layer)
	}
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	what := fmt.Sprintf("layer %s of bucket %s", layer, t.name)
	if key != "" {
		what = fmt.Sprintf("key %q of %s", key, what)
	}
	if sub == "reset" {
		if err := ls.ResetLayer(ctx, layer, key); err != nil {
			return fmt.Errorf("reset %s: %w", what, err)
		}
		if !asJSON {
			if l.IsConcurrency() {
				fmt.Fprintf(stdout, "Reset %s: its slots are free (their holders' releases do nothing).\n", what)
			} else if l.IsQuota() || l.IsBudget() {
				fmt.Fprintf(stdout, "Reset %s: its quota is unused for the rest of the window.\n", what)
			} else {
				fmt.Fprintf(stdout, "Reset %s: its bucket is full.\n", what)
			}
			return nil
		}
	}
	st, err := ls.LayerStatus(ctx, layer, key)
	if err != nil {
		return fmt.Errorf("reading %s: %w", what, err)
	}
	out := layerStatusJSON{Bucket: t.name, Layer: layer, Key: key, Full: st.Full}
	switch {
	case l.IsConcurrency():
		out.Kind, out.Concurrency, out.Used = "concurrency", l.Concurrency, &st.Used
	case l.IsWindow():
		open, opens, closes := st.Full, st.Open[0], st.Open[1]
		out.Kind, out.Open, out.Opens, out.Closes = "window", &open, &opens, &closes
	case l.IsBudget():
		end := st.WindowEnd.In(l.Location)
		budget, spent, left := l.Budget.Float(), st.Spent.Float(), (l.Budget - st.Spent).Float()
		out.Kind, out.Per, out.Timezone, out.WindowEnd = "budget", string(l.Per), l.Location.String(), &end
		out.Budget, out.Spent, out.Left = &budget, &spent, &left
	case l.IsQuota():
		end := st.WindowEnd.In(l.Location)
		out.Kind, out.Quota, out.Per, out.Timezone, out.Used, out.WindowEnd = "quota", l.Quota, string(l.Per), l.Location.String(), &st.Used, &end
	default:
		out.Kind, out.Rate, out.Burst, out.Tokens = "bucket", l.Rate, l.Burst, &st.Tokens
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(stdout, "Bucket %s, layer %s (%s)", t.name, layer, describeLayer(l))
	if key != "" {
		fmt.Fprintf(stdout, ", key %q", key)
	}
	fmt.Fprintln(stdout, ":")
	switch {
	case l.IsConcurrency():
		fmt.Fprintf(stdout, "  in use:  %d of %d slots\n", st.Used, l.Concurrency)
	case l.IsWindow():
		state := "closed; opens " + st.Open[0].Format(time.RFC3339) + fmt.Sprintf(" (in %v)", st.Open[0].Sub(st.At).Round(time.Second))
		if st.Full {
			state = "open; closes " + st.Open[1].Format(time.RFC3339) + fmt.Sprintf(" (in %v)", st.Open[1].Sub(st.At).Round(time.Second))
		}
		fmt.Fprintf(stdout, "  window:  %s\n", state)
	case l.IsBudget():
		fmt.Fprintf(stdout, "  spent:   %s of %s this %s, %s left; resets %s (in %v)\n", st.Spent, l.Budget, l.Per, l.Budget-st.Spent,
			out.WindowEnd.Format(time.RFC3339), st.WindowEnd.Sub(st.At).Round(time.Second))
	case l.IsQuota():
		fmt.Fprintf(stdout, "  used:    %d of %d this %s; resets %s (in %v)\n", st.Used, l.Quota, l.Per,
			out.WindowEnd.Format(time.RFC3339), st.WindowEnd.Sub(st.At).Round(time.Second))
	default:
		full := ""
		if !st.Full {
			full = fmt.Sprintf(" (full in %v)", time.Duration((float64(l.Burst)-st.Tokens)/l.Rate*float64(time.Second)).Round(time.Second))
		}
		fmt.Fprintf(stdout, "  tokens:  %.3f of %d%s\n", st.Tokens, l.Burst, full)
	}
	return nil
}

// describeLayer says what a layer limits, in a few words.
func describeLayer(l limiter.Layer) string {
	var s string
	switch {
	case l.IsConcurrency():
		s = fmt.Sprintf("concurrency %d, lease %v", l.Concurrency, l.Lease)
	case l.IsWindow():
		s = describeWindow(l.Window)
	case l.IsBudget():
		s = fmt.Sprintf("budget %s per %s, %s", l.Budget, l.Per, l.Location)
	case l.IsQuota():
		s = fmt.Sprintf("quota %d per %s, %s", l.Quota, l.Per, l.Location)
	default:
		s = fmt.Sprintf("%s, burst %d", formatRate(l.Rate), l.Burst)
	}
	if l.Keyed {
		s += ", per key"
	}
	s += ", on_exceed " + string(l.OnExceed)
	if l.MaxWait > 0 {
		s += fmt.Sprintf(" after %v", l.MaxWait)
	}
	if l.Shadow {
		s += ", SHADOW (not enforced; exceeded = would have)"
	}
	return s
}

// layerJSON is a layer of limit.extra as 'bucket status' shows it, in text
// and JSON (readLayers computes it, writeLayers and --json render it).
type layerJSON struct {
	Layer string `json:"layer"`
	// Kind is "bucket" (a token bucket), "quota" (a count per window) or
	// "concurrency" (slots in flight).
	Kind  string `json:"kind"`
	Keyed bool   `json:"keyed"`
	// Rate and Burst are set for a bucket; Quota, Per and Timezone for a
	// quota.
	Rate        float64 `json:"rate,omitempty"`
	Burst       int     `json:"burst,omitempty"`
	Concurrency int     `json:"concurrency,omitempty"`
	Quota       int     `json:"quota,omitempty"`
	Per         string  `json:"per,omitempty"`
	Timezone    string  `json:"timezone,omitempty"`
	OnExceed    string  `json:"on_exceed"`
	// Shadow is set for a shadow layer (limit.extra[].shadow): decided
	// and counted, never enforced; its state is its own.
	Shadow bool `json:"shadow,omitempty"`
	// KeysInUse is, for a keyed layer, how many keys hold state in Redis,
	// counted with SCAN; KeysEstimated is set when it is an estimate (past
	// 100000 keys per master). Nil for a layer without keys.
	KeysInUse     *int64 `json:"keys_in_use,omitempty"`
	KeysEstimated bool   `json:"keys_estimated,omitempty"`
	// Tokens (bucket) or Used (quota) is the state of a layer without
	// keys.
	Tokens *float64 `json:"tokens,omitempty"`
	Used   *int     `json:"used,omitempty"`
	// Budget is a budget's allowance per window; Spent and Left what a
	// budget without keys spent this window and has left, in its
	// currency.
	Budget *float64 `json:"budget,omitempty"`
	Spent  *float64 `json:"spent,omitempty"`
	Left   *float64 `json:"left,omitempty"`

	layer limiter.Layer
	spent limiter.Amount // Spent, exactly
}

// bucketLayers returns the layers of cfgPath's limit.extra when it is the
// config of bucket t. known is false when the layers are unknown: no
// --config, or one of another bucket; ls is nil when the config has none.
func bucketLayers(t *bucketTarget, cfgPath string) (ls *redislimiter.Layered, known bool, err error) {
	if cfgPath == "" {
		return nil, false, nil
	}
	cfg, err := loadConfig(cfgPath)
	if err != nil {
		return nil, false, err
	}
	return configLayers(t, cfg)
}

// configLayers is bucketLayers for a config already loaded.
func configLayers(t *bucketTarget, cfg *config.Config) (ls *redislimiter.Layered, known bool, err error) {
	if cfg == nil || cfg.Limit.Bucket != t.name {
		return nil, false, nil
	}
	if ls, err = layersOf(t.client, cfg); err != nil {
		return nil, false, &configError{err: err}
	}
	return ls, true, nil
}

// readLayers returns the layers of cfgPath's limit.extra, when it is the
// config of bucket t, with the keys each has in use (counted with SCAN,
// estimated past 100000 keys per master), or a layer without keys its
// state. It returns nil when the layers are unknown (no --config, or one of
// another bucket) and an empty slice when the config has none.
func readLayers(ctx context.Context, t *bucketTarget, cfgPath string) ([]layerJSON, error) {
	ls, known, err := bucketLayers(t, cfgPath)
	return readLayersOf(ctx, t, ls, known, err)
}

// readLayersOf is readLayers with the layers bucketLayers or configLayers
// returned.
func readLayersOf(ctx context.Context, t *bucketTarget, ls *redislimiter.Layered, known bool, err error) ([]layerJSON, error) {
	if err != nil || !known {
		return nil, err
	}
	if ls == nil {
		return []layerJSON{}, nil
	}
	return layerStates(ctx, t.client, ls, true)
}

// layerStates reads each layer of ls: a keyed layer's keys in use, counted
// with SCAN (estimated past 100000 keys per master) when countKeys is set,
// else left nil; a layer without keys, its state.
func layerStates(ctx context.Context, client redis.UniversalClient, ls *redislimiter.Layered, countKeys bool) ([]layerJSON, error) {
	out := []layerJSON{}
	for _, l := range ls.Layers() {
		lj := layerJSON{Layer: l.Name, Kind: "bucket", Keyed: l.Keyed, OnExceed: string(l.OnExceed), Shadow: l.Shadow, layer: l}
		switch {
		case l.IsConcurrency():
			lj.Kind, lj.Concurrency = "concurrency", l.Concurrency
		case l.IsWindow():
			lj.Kind = "window"
			out = append(out, lj) // no state to count or read
			continue
		case l.IsBudget():
			b := l.Budget.Float()
			lj.Kind, lj.Budget, lj.Per, lj.Timezone = "budget", &b, string(l.Per), l.Location.String()
		case l.IsQuota():
			lj.Kind, lj.Quota, lj.Per, lj.Timezone = "quota", l.Quota, string(l.Per), l.Location.String()
		default:
			lj.Rate, lj.Burst = l.Rate, l.Burst
		}
		switch {
		case l.Keyed && countKeys:
			n, err := ls.CountLayerKeys(ctx, client, l.Name)
			if err != nil {
				return nil, err
			}
			lj.KeysInUse, lj.KeysEstimated = &n.Keys, !n.Exact
		case !l.Keyed:
			st, err := ls.LayerStatus(ctx, l.Name, "")
			if err != nil {
				return nil, fmt.Errorf("reading layer %s: %w", l.Name, err)
			}
			switch {
			case l.IsBudget():
				spent, left := st.Spent.Float(), (l.Budget - st.Spent).Float()
				lj.Spent, lj.Left, lj.spent = &spent, &left, st.Spent
			case !l.IsBucket(): // a quota, a concurrency layer
				lj.Used = &st.Used
			default:
				lj.Tokens = &st.Tokens
			}
		}
		out = append(out, lj)
	}
	return out, nil
}

// writeLayers prints the layers readLayers read, if any.
func writeLayers(w io.Writer, layers []layerJSON) {
	if len(layers) == 0 {
		return
	}
	fmt.Fprintln(w, "Layers (limit.extra):")
	for _, l := range layers {
		var count string
		switch {
		case l.KeysInUse != nil && l.KeysEstimated:
			count = fmt.Sprintf("about %d keys in use (estimated)", *l.KeysInUse)
		case l.KeysInUse != nil:
			count = fmt.Sprintf("%d keys in use", *l.KeysInUse)
		case l.Used != nil:
			count = fmt.Sprintf("used %d this %s", *l.Used, l.Per)
		case l.Spent != nil:
			count = fmt.Sprintf("spent %s this %s, %s left", l.spent, l.Per, l.layer.Budget-l.spent)
		case l.Tokens != nil:
			count = fmt.Sprintf("%.3f tokens", *l.Tokens)
		}
		fmt.Fprintf(w, "  %-16s %s; %s\n", l.Layer, describeLayer(l.layer), count)
	}
}

// resetLayers, for 'bucket reset' of the whole bucket, deletes the state of
// every key of every layer of cfgPath's limit.extra (SCAN and UNLINK, every
// master of a Cluster), and returns done with a sentence saying what
// happened to the layers: how many keys it removed, or, without --config,
// that layers, if any, were left.
func (t *bucketTarget) resetLayers(ctx context.Context, cfgPath, done string) (string, error) {
	ls, known, err := bucketLayers(t, cfgPath)
	switch {
	case err != nil:
		return done, err
	case !known && cfgPath == "":
		return done + " The keys of layers of limit.extra, if any, were left: pass --config FILE to reset them too.", nil
	case !known:
		return done + fmt.Sprintf(" %s configures another bucket: the keys of the layers of limit.extra of %s, if any, were left.", cfgPath, t.name), nil
	case ls == nil:
		return done, nil
	}
	n, err := resetLayers(ctx, t, ls)
	if err != nil {
		return done, fmt.Errorf("resetting its layers after %d keys: %w", n, err)
	}
	return done + fmt.Sprintf(" Reset its %s (limit.extra): removed %s.", plural(len(ls.Layers()), "layer"), plural(int(n), "key")), nil
}

// resetLayers deletes the state of every key of every layer in ls, and
// returns how many keys it deleted.
func resetLayers(ctx context.Context, t *bucketTarget, ls *redislimiter.Layered) (int64, error) {
	var total int64
	for _, l := range ls.Layers() {
		n, err := ls.ResetLayerKeys(ctx, t.client, l.Name)
		total += n
		if err != nil {
			return total, fmt.Errorf("layer %s: %w", l.Name, err)
		}
	}
	return total, nil
}

// describeWindow says when a window is open: "08:00-21:00 mon-sun in the
// zone of each number (default UTC), FR 08:00-20:00 mon-sat, high exempt".
func describeWindow(w *limiter.Window) string {
	cal := func(c limiter.Calendar) string {
		clock := func(d time.Duration) string {
			if d%time.Minute != 0 {
				return fmt.Sprintf("%02d:%02d:%02d", int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60)
			}
			return fmt.Sprintf("%02d:%02d", int(d.Hours()), int(d.Minutes())%60)
		}
		return clock(c.From) + "-" + clock(c.To) + " " + c.Days.String()
	}
	s := "window " + cal(w.Calendar)
	if w.ByNumber {
		s += fmt.Sprintf(" in the zone of each number (default %s)", w.DefaultLocation)
	} else {
		s += " " + w.Location.String()
	}
	for _, c := range slices.Sorted(maps.Keys(w.Countries)) {
		s += ", " + c + " " + cal(w.Countries[c])
	}
	for _, p := range w.Exempt {
		s += ", " + p.String() + " exempt"
	}
	return s
}
