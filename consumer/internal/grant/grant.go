// Package grant carries, in a context, where a limiter wait records how it
// was granted (limiter.Grant: the wait and the layer that set it), for the
// throttle wait span of package consumer. It passes through the limiters a
// backend wraps around the configured one (consumer/kafka's revocation
// wrapper) as long as they pass the context's values on.
package grant

import (
	"context"

	"github.com/throttlehq/throttle/limiter"
)

// Record is where a wait records its grant.
type Record struct {
	Grant limiter.Grant
	// Set is true once a limiter recorded the grant.
	Set bool
}

type key struct{}

// With returns ctx asking for the grant, and the Record it goes to.
func With(ctx context.Context) (context.Context, *Record) {
	rec := &Record{}
	return context.WithValue(ctx, key{}, rec), rec
}

// Wanted reports whether ctx asks for the grant.
func Wanted(ctx context.Context) bool {
	_, ok := ctx.Value(key{}).(*Record)
	return ok
}

// Set records g in ctx's Record, if ctx asks for one.
func Set(ctx context.Context, g limiter.Grant) {
	if rec, ok := ctx.Value(key{}).(*Record); ok {
		rec.Grant, rec.Set = g, true
	}
}

// Wait is l.Wait(ctx, cost); on a *limiter.Bucket, when ctx asks for the
// grant, it waits as Bucket.Wait does (the Bucket's class, every layer)
// with Bucket.WaitGrant and records the grant.
func Wait(ctx context.Context, l interface {
	Wait(context.Context, int) error
}, cost int) error {
	if b, ok := l.(*limiter.Bucket); ok && Wanted(ctx) {
		g, err := b.WaitGrant(ctx, limiter.Request{Cost: cost, Priority: b.Priority()})
		if err == nil {
			Set(ctx, g)
		}
		return err
	}
	return l.Wait(ctx, cost)
}
