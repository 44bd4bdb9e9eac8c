package redislimiter

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/limiter"
)

// Watch implements limiter.Notifier. It subscribes to the bucket's channel,
// PREFIX{NAME}:changes, on which the scripts of Admin's SetOverride,
// ClearOverride, Fill and Reset and of Store's Pause announce themselves,
// and calls changed for each announcement until ctx ends. A take that
// moves the reservations of lower classes announces a push ("push ...",
// see parsePush) instead, for which Watch calls pushed, unless nil, and
// never changed. go-redis resubscribes by itself after a connection
// failure. Announcements made while the subscription was down are lost, so
// Watch also calls changed once after each resubscription: the replica
// then takes its sleeping reservations again and finds whatever changed
// meanwhile.
func (s *Store) Watch(ctx context.Context, changed func(), pushed func(limiter.Push)) {
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
			switch m := msg.(type) {
			case *redis.Subscription:
				if m.Kind != "subscribe" {
					continue
				}
				if !subscribed { // the first subscription: nothing was missed
					subscribed = true
					continue
				}
			case *redis.Message:
				if strings.HasPrefix(m.Payload, "push ") {
					if pushed != nil {
						for _, p := range parsePush(m.Payload) {
							pushed(p)
						}
					}
					continue
				}
			}
			changed()
		}
	}
}

// parsePush parses a push announcement, "push NOW_US TOKENS_MILLI
// RANK:COUNTER_MILLI...", into one Push per class named. A malformed
// announcement gives none.
func parsePush(payload string) []limiter.Push {
	f := strings.Fields(payload)
	if len(f) < 4 || f[0] != "push" {
		return nil
	}
	at, err1 := strconv.ParseInt(f[1], 10, 64)
	tokens, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return nil
	}
	out := make([]limiter.Push, 0, len(f)-3)
	for _, rc := range f[3:] {
		r, c, ok := strings.Cut(rc, ":")
		rank, err1 := strconv.Atoi(r)
		counter, err2 := strconv.ParseInt(c, 10, 64)
		if !ok || err1 != nil || err2 != nil || rank < 1 || rank > 2 {
			return nil
		}
		out = append(out, limiter.Push{
			Class:   limiter.PriorityOfRank(rank),
			Tokens:  float64(tokens) / 1000,
			Counter: float64(counter) / 1000,
			At:      time.UnixMicro(at),
		})
	}
	return out
}

var _ limiter.Notifier = (*Store)(nil)
