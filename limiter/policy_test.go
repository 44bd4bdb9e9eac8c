package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttlehq/throttle/limiter"
)

// A window's key that is not a telephone number refuses the message for
// good (dead_letter), at once: it is not a store failure, so the Bucket
// neither retries nor falls back.
func TestWindowKeyNotANumber(t *testing.T) {
	b, err := limiter.NewLocal(100, 10, limiter.Layer{Name: "quiet", Keyed: true, Window: &limiter.Window{
		Calendar: limiter.Calendar{From: 0, To: 24 * time.Hour}, ByNumber: true,
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err = b.WaitN(ctx, limiter.Request{Cost: 1, Keys: map[string]string{"quiet": "call me"}})
	var le *limiter.LimitError
	if !errors.As(err, &le) || le.Action != limiter.ActionDeadLetter || le.Layer != "quiet" {
		t.Fatalf("WaitN = %v, want a dead_letter *LimitError of quiet", err)
	}
	if m := b.Mode(); m != limiter.ModeShared {
		t.Errorf("mode %v after a bad key, want shared: a bad key is no store failure", m)
	}
	if err := b.WaitN(ctx, limiter.Request{Cost: 1, Keys: map[string]string{"quiet": "+12125550100"}}); err != nil {
		t.Errorf("a number, always open: %v", err)
	}
}
