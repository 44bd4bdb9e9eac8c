package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
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
	Bucket    string     `json:"bucket"`
	Layer     string     `json:"layer"`
	Key       string     `json:"key,omitempty"`
	Kind      string     `json:"kind"` // "bucket" or "quota"
	Rate      float64    `json:"rate,omitempty"`
	Burst     int        `json:"burst,omitempty"`
	Tokens    *float64   `json:"tokens,omitempty"`
	Quota     int        `json:"quota,omitempty"`
	Per       string     `json:"per,omitempty"`
	Used      *int       `json:"used,omitempty"`
	WindowEnd *time.Time `json:"window_end,omitempty"`
	Full      bool       `json:"full"`
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
			if l.IsQuota() {
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
	if l.IsQuota() {
		end := st.WindowEnd.In(l.Location)
		out.Kind, out.Quota, out.Per, out.Used, out.WindowEnd = "quota", l.Quota, string(l.Per), &st.Used, &end
	} else {
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
	if l.IsQuota() {
		fmt.Fprintf(stdout, "  used:    %d of %d this %s; resets %s (in %v)\n", st.Used, l.Quota, l.Per,
			out.WindowEnd.Format(time.RFC3339), st.WindowEnd.Sub(st.At).Round(time.Second))
	} else {
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
	if l.IsQuota() {
		s = fmt.Sprintf("quota %d per %s, %s", l.Quota, l.Per, l.Location)
	} else {
		s = fmt.Sprintf("%s, burst %d", formatRate(l.Rate), l.Burst)
	}
	if l.Keyed {
		s += ", per key"
	}
	s += ", on_exceed " + string(l.OnExceed)
	if l.MaxWait > 0 {
		s += fmt.Sprintf(" after %v", l.MaxWait)
	}
	return s
}

// writeLayerList prints the layers of cfgPath's limit.extra, when it is the
// config of bucket t, with the keys each has in use (counted with SCAN,
// estimated past 100000 keys per master).
func writeLayerList(ctx context.Context, w io.Writer, t *bucketTarget, cfgPath string) error {
	if cfgPath == "" {
		return nil
	}
	cfg, err := loadConfig(cfgPath)
	if err != nil || cfg.Limit.Bucket != t.name {
		return err
	}
	ls, err := layersOf(t.client, cfg)
	if err != nil || ls == nil {
		return err
	}
	fmt.Fprintln(w, "Layers (limit.extra):")
	for _, l := range ls.Layers() {
		n, err := ls.CountLayerKeys(ctx, t.client, l.Name)
		if err != nil {
			return err
		}
		count := fmt.Sprintf("%d keys in use", n.Keys)
		if !n.Exact {
			count = fmt.Sprintf("about %d keys in use (estimated)", n.Keys)
		}
		if !l.Keyed {
			count = "no key"
			if st, err := ls.LayerStatus(ctx, l.Name, ""); err == nil && l.IsQuota() {
				count = fmt.Sprintf("used %d this %s", st.Used, l.Per)
			} else if err == nil {
				count = fmt.Sprintf("%.3f tokens", st.Tokens)
			}
		}
		fmt.Fprintf(w, "  %-16s %s; %s\n", l.Name, describeLayer(l), count)
	}
	return nil
}
