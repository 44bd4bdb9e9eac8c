package redislimiter

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
)

// Watch implements backend.Notifier. It subscribes to the bucket's channel,
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
//
// Every Watch on one Redis client shares one Pub/Sub connection, however
// many buckets and Stores use the client: it is opened with the first
// Watch and closed when the last one ends. changed and pushed are called
// from that connection's reader, so they must not block.
func (s *Store) Watch(ctx context.Context, changed func(), pushed func(backend.Push)) {
	h := joinHub(s.client)
	defer h.leave()
	w := &watcher{changed: changed, pushed: pushed}
	h.add(ctx, s.channel, w)
	defer h.remove(s.channel, w)
	<-ctx.Done()
}

// watcher is one Watch call's callbacks.
type watcher struct {
	changed func()
	pushed  func(backend.Push)
	// message, when set, receives every message of the channel instead
	// (WatchSlots).
	message func(payload string)
}

// hubs holds the Pub/Sub hub of each Redis client in use.
var hubs = struct {
	sync.Mutex
	m map[Client]*pubsubHub
}{m: map[Client]*pubsubHub{}}

// pubsubHub is one Pub/Sub connection of a Redis client, shared by every
// Watch on it: it subscribes to a channel while a Watch listens there and
// fans each message out to that channel's watchers. Its reader goroutine
// runs from the first Watch to the end of the last.
type pubsubHub struct {
	client Client
	ps     *redis.PubSub
	done   chan struct{} // closed when the reader has returned
	refs   int           // guarded by hubs

	mu       sync.Mutex
	watchers map[string]map[*watcher]struct{}
	// subscribed holds the channels whose first subscription was
	// confirmed: a later confirmation is a resubscription.
	subscribed map[string]bool
}

// joinHub returns client's hub, opening it for the first Watch. The caller
// calls leave when its Watch ends.
func joinHub(client Client) *pubsubHub {
	hubs.Lock()
	defer hubs.Unlock()
	h := hubs.m[client]
	if h == nil {
		h = &pubsubHub{
			client: client, ps: client.Subscribe(context.Background()), done: make(chan struct{}),
			watchers: map[string]map[*watcher]struct{}{}, subscribed: map[string]bool{},
		}
		hubs.m[client] = h
		go h.read()
	}
	h.refs++
	return h
}

// leave ends one Watch's use of the hub; the last closes its connection
// and waits for its reader.
func (h *pubsubHub) leave() {
	hubs.Lock()
	h.refs--
	last := h.refs == 0
	if last {
		delete(hubs.m, h.client)
	}
	hubs.Unlock()
	if last {
		h.ps.Close()
		<-h.done
	}
}

// add registers w on channel, subscribing to it for the first watcher.
func (h *pubsubHub) add(ctx context.Context, channel string, w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := h.watchers[channel]
	if ws == nil {
		ws = map[*watcher]struct{}{}
		h.watchers[channel] = ws
		// An error here is a connection down: go-redis subscribes
		// again when it reconnects, and the watchers hear a change.
		_ = h.ps.Subscribe(ctx, channel)
	}
	ws[w] = struct{}{}
}

// remove unregisters w, unsubscribing from channel after its last watcher.
func (h *pubsubHub) remove(channel string, w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := h.watchers[channel]
	delete(ws, w)
	if len(ws) == 0 {
		delete(h.watchers, channel)
		delete(h.subscribed, channel)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = h.ps.Unsubscribe(ctx, channel)
		cancel()
	}
}

// of returns the watchers of channel now.
func (h *pubsubHub) of(channel string) []*watcher {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*watcher, 0, len(h.watchers[channel]))
	for w := range h.watchers[channel] {
		out = append(out, w)
	}
	return out
}

// read fans the connection's messages out until it is closed.
func (h *pubsubHub) read() {
	defer close(h.done)
	for msg := range h.ps.ChannelWithSubscriptions() {
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			h.mu.Lock()
			again := h.subscribed[m.Channel]
			h.subscribed[m.Channel] = true
			h.mu.Unlock()
			if !again { // the first subscription: nothing was missed
				continue
			}
			for _, w := range h.of(m.Channel) {
				w.changed()
			}
		case *redis.Message:
			ws := h.of(m.Channel)
			if len(ws) > 0 && ws[0].message != nil {
				for _, w := range ws {
					if w.message != nil {
						w.message(m.Payload)
					}
				}
				continue
			}
			if strings.HasPrefix(m.Payload, "push ") {
				ps := parsePush(m.Payload)
				for _, w := range ws {
					if w.pushed != nil {
						for _, p := range ps {
							w.pushed(p)
						}
					}
				}
				continue
			}
			for _, w := range ws {
				w.changed()
			}
		}
	}
}

// parsePush parses a push announcement, "push NOW_US TOKENS_MILLI
// RANK:COUNTER_MILLI...", into one Push per class named. A malformed
// announcement gives none.
func parsePush(payload string) []backend.Push {
	f := strings.Fields(payload)
	if len(f) < 4 || f[0] != "push" {
		return nil
	}
	at, err1 := strconv.ParseInt(f[1], 10, 64)
	tokens, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return nil
	}
	out := make([]backend.Push, 0, len(f)-3)
	for _, rc := range f[3:] {
		r, c, ok := strings.Cut(rc, ":")
		rank, err1 := strconv.Atoi(r)
		counter, err2 := strconv.ParseInt(c, 10, 64)
		if !ok || err1 != nil || err2 != nil || rank < 1 || rank > 2 {
			return nil
		}
		out = append(out, backend.Push{
			Class:   backend.PriorityOfRank(rank),
			Tokens:  float64(tokens) / 1000,
			Counter: float64(counter) / 1000,
			At:      time.UnixMicro(at),
		})
	}
	return out
}

var _ backend.Notifier = (*Store)(nil)

// watcherCount returns how many Watch calls listen on channel through
// client's shared connection.
func watcherCount(client Client, channel string) int {
	hubs.Lock()
	h := hubs.m[client]
	hubs.Unlock()
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.watchers[channel])
}
