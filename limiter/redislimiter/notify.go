package redislimiter

import (
	"context"

	"github.com/throttlehq/throttle/limiter"
)

// Watch implements limiter.Notifier. It subscribes to the bucket's channel,
// PREFIX{NAME}:changes, on which SetOverride, ClearOverride, Fill, Reset and
// Pause announce themselves, and calls changed for each announcement until
// ctx ends. go-redis resubscribes by itself after a connection failure;
// announcements made while the subscription was down are lost, and the
// reservations they would have reached keep their time, which is at most the
// reservation horizon away.
func (s *Store) Watch(ctx context.Context, changed func()) {
	ps := s.client.Subscribe(ctx, s.channel)
	defer ps.Close()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				return
			}
			changed()
		}
	}
}

// announce tells every replica's Watch that the bucket changed. The change
// itself is already stored, so a failed announcement only means replicas
// notice it at their next take instead of at once.
func (s *Store) announce(ctx context.Context, op string) {
	_ = s.client.Publish(ctx, s.channel, op).Err()
}

var _ limiter.Notifier = (*Store)(nil)
