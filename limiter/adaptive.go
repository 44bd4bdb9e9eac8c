package limiter

import (
	"context"

	"github.com/throttlehq/throttle/internal/backend"
)

// pushedBack lowers the adaptive rate after a push-back when
// Options.Adaptive is set: in the store when the Bucket is shared and the
// store is an Adapter, else in the local fallback bucket.
func (b *Bucket) pushedBack(ctx context.Context, shared bool) {
	a := b.opts.Adaptive
	if a == nil {
		return
	}
	if shared {
		ad, ok := b.store.(backend.Adapter)
		if !ok {
			return
		}
		rate, decreased, err := ad.Decrease(ctx, *a)
		if err != nil {
			if o := b.opts.Observer; o != nil && o.StoreError != nil {
				o.StoreError(err)
			}
			return
		}
		if decreased {
			b.log.Info("push-back: adaptive rate lowered", "rate", rate, "replica", b.opts.ReplicaID)
		}
		return
	}
	if fb := b.fallbackBucket(); fb != nil {
		fb.DecreaseAt(b.clock.Now(), *a)
	}
}
