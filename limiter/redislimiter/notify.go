package redislimiter

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/limiter"
)

// Watch implements limiter.Notifier. It subscribes to the bucket's channel,
// PREFIX{NAME}:changes, on which the scripts of Admin's SetOverride,
// ClearOverride, Fill and Reset and of Store's Pause announce themselves, and calls changed for each announcement until
// ctx ends. go-redis resubscribes by itself after a connection failure.
// Announcements made while the subscription was down are lost, so Watch
// also calls changed once after each resubscription: the replica then takes
// its sleeping reservations again and finds whatever changed meanwhile.
func (s *Store) Watch(ctx context.Context, changed func()) {
	ps := s.client.Subscribe(ctx, s.channel)
	defer ps.Close()
	ch := ps.ChannelWithSubscriptions()
	subscribed := false
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			if sub, isSub := msg.(*redis.Subscription); isSub {
				if sub.Kind != "subscribe" {
					continue
				}
				if !subscribed { // the first subscription: nothing was missed
					subscribed = true
					continue
				}
			}
			changed()
		}
	}
}

var _ limiter.Notifier = (*Store)(nil)
