package limiter_test

import (
	"context"
	"errors"
	"testing"

	"github.com/throttlehq/throttle/limiter"
)

// TestNewLocalWithLayers: NewLocal's layers are decided with the shared
// bucket: a keyed dead_letter layer of burst 1 refuses a key's second
// message with a *LimitError naming it, counted in Stats, while another key
// passes; Bucket.Layers reports the layer with its defaults filled in.
func TestNewLocalWithLayers(t *testing.T) {
	t.Parallel()
	b, err := limiter.NewLocal(1000, 100, limiter.Layer{
		Name: "per-recipient", Keyed: true, Rate: 1.0 / 60, OnExceed: limiter.ActionDeadLetter,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx := context.Background()
	to := func(k string) limiter.Request {
		return limiter.Request{Cost: 1, Keys: map[string]string{"per-recipient": k}}
	}
	if err := b.WaitN(ctx, to("a")); err != nil {
		t.Fatalf("first message to a: %v", err)
	}
	var le *limiter.LimitError
	if err := b.WaitN(ctx, to("a")); !errors.As(err, &le) || le.Layer != "per-recipient" || !errors.Is(err, limiter.ErrLimitExceeded) {
		t.Fatalf("second message to a: %v, want the layer's *LimitError", err)
	}
	if err := b.WaitN(ctx, to("b")); err != nil {
		t.Fatalf("first message to b: %v", err)
	}
	if err := b.Wait(ctx, 1); !errors.Is(err, limiter.ErrMissingKey) {
		t.Errorf("Wait on a keyed layer: %v, want ErrMissingKey", err)
	}
	st := b.Stats()
	if st.Granted != 2 || st.Exceeded["per-recipient"] != 1 || st.Replicas != 1 {
		t.Errorf("Stats = %+v, want 2 granted, 1 refusal by per-recipient, 1 replica", st)
	}
	if ls := b.Layers(); len(ls) != 1 || ls[0].Burst != 1 {
		t.Errorf("Layers = %+v, want per-recipient with its default burst 1", ls)
	}
}

// TestNewLocalStoreErrors: a bad rate or layer gives a *ParamError naming
// it, and no store: the nil interface, not a typed nil that New would take.
func TestNewLocalStoreErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		rate   float64
		layers []limiter.Layer
		param  string
	}{
		{"rate", 0, nil, "Rate"},
		{"layer name", 10, []limiter.Layer{{Name: "a b", Rate: 1}}, "Layers[0].Name"},
		{"layer rate", 10, []limiter.Layer{{Name: "a"}}, "Layers[0].Rate"},
	} {
		s, err := limiter.NewLocalStore(tc.rate, 0, tc.layers...)
		var pe *limiter.ParamError
		if !errors.As(err, &pe) || pe.Param != tc.param {
			t.Errorf("%s: %v, want a *ParamError for %s", tc.name, err, tc.param)
		}
		if s != nil {
			t.Errorf("%s: store %#v, want nil", tc.name, s)
		}
	}
	if _, err := limiter.NewLocal(10, 0, limiter.Layer{Name: "a", Rate: 1}, limiter.Layer{Name: "a", Rate: 2}); err == nil {
		t.Error("NewLocal with two layers named a: no error")
	}
}

// TestLayersValidateFillsDefaults: Layers.Validate, which config calls,
// fills a bucket layer's burst and action and a quota's time zone in place.
func TestLayersValidateFillsDefaults(t *testing.T) {
	t.Parallel()
	ls := limiter.Layers{{Name: "per-key", Keyed: true, Rate: 2.5}, {Name: "daily", Quota: 100, Per: limiter.PerDay}}
	if err := ls.Validate(); err != nil {
		t.Fatal(err)
	}
	if ls[0].Burst != 3 || ls[0].OnExceed != limiter.ActionWait || ls[1].Location == nil {
		t.Errorf("after Validate: %+v", ls)
	}
}
