package redislimiter

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
)

// slotsReleaseScript gives back concurrency slots, several in one call,
// and announces the releases that free a slot of a key whose slots were
// all held (lua/slots_release.lua).
var slotsReleaseScript = redis.NewScript(luaSource("slots_release.lua"))

// slotsChannel returns the Pub/Sub channel on which a bucket's slot
// releases are announced: PREFIX{NAME}:slots.
func (l *Layered) slotsChannel() string {
	return l.cfg.Prefix + "{" + l.cfg.Bucket + "}:slots"
}

// ReleaseSlots implements backend.SlotStore: it gives back the slots in
// one script call on a single node (one per key on a Cluster, pipelined),
// batched with the releases and takes of concurrent callers (see
// layerBatcher): the slots are queued for the next call, or for a call of
// their own when none is in flight, and ReleaseSlots returns at once, nil
// (a failure leaves them to their leases); a take made after it returns
// is sent after the release. With Config.NoBatching every release is its
// own call, and ReleaseSlots returns its error. A release that frees a
// slot of a key whose slots were all held is announced on
// PREFIX{NAME}:slots, which wakes the requests that wait for that key on
// every replica (WatchSlots).
func (l *Layered) ReleaseSlots(ctx context.Context, slots []backend.SlotRelease) error {
	if len(slots) == 0 {
		return nil
	}
	if l.batch != nil {
		l.batch.release(ctx, slots)
		return nil
	}
	return l.releaseSlots(ctx, slots)
}

// WaitReleases implements backend.ReleaseWaiter: it waits until the
// releases that ReleaseSlots left to a goroutine of their own were sent
// (their call answered or failed: at most the client's timeouts), or ctx
// ends. limiter.Bucket.Close calls it.
func (l *Layered) WaitReleases(ctx context.Context) error {
	if l.batch == nil {
		return nil
	}
	return l.batch.waitReleases(ctx)
}

// maxReleaseBatch bounds the slots of one release script call.
const maxReleaseBatch = 256

// releaseSlots sends the release of slots in one pipeline (releaseCmds).
func (l *Layered) releaseSlots(ctx context.Context, slots []backend.SlotRelease) error {
	pipe := l.client.Pipeline()
	cmds := l.releaseCmds(ctx, pipe, slots)
	if len(cmds) == 0 {
		return nil
	}
	_, _ = pipe.Exec(ctx)
	return l.releaseReplies(ctx, cmds)
}

// releaseCall is one call of slotsReleaseScript queued on a pipeline.
type releaseCall struct {
	cmd  *redis.Cmd
	keys []string
	args []any
}

// releaseCmds queues on pipe the script calls that release slots: one per
// maxReleaseBatch slots on a single node, one per slot on a Cluster.
func (l *Layered) releaseCmds(ctx context.Context, pipe redis.Pipeliner, slots []backend.SlotRelease) []releaseCall {
	var out []releaseCall
	per := maxReleaseBatch
	if l.cluster {
		per = 1
	}
	for len(slots) > 0 {
		n := min(per, len(slots))
		keys := make([]string, 0, n)
		args := make([]any, 0, 1+3*n)
		args = append(args, l.slotsChannel())
		for _, s := range slots[:n] {
			i, err := l.layerIndex(s.Layer)
			if err != nil || !l.layers[i].IsConcurrency() {
				continue
			}
			keys = append(keys, l.layerKey(i, s.Key))
			args = append(args, s.Holder, l.spec[i][2], "slot "+s.Layer+" "+s.Key)
		}
		slots = slots[n:]
		if len(keys) > 0 {
			out = append(out, releaseCall{slotsReleaseScript.EvalSha(ctx, pipe, keys, args...), keys, args})
		}
	}
	return out
}

// releaseReplies returns the first error of the release calls sent, after
// running again, with the script loaded, those that Redis did not know
// (NOSCRIPT: a restart, SCRIPT FLUSH).
func (l *Layered) releaseReplies(ctx context.Context, calls []releaseCall) error {
	var first error
	for _, c := range calls {
		if err := l.rerunUnknown(ctx, slotsReleaseScript, c.cmd, c.keys, c.args); err != nil && first == nil {
			first = l.fail("release slots", err)
		}
	}
	return first
}

// rerunUnknown returns the error of cmd, a call of script with keys and
// args sent by EvalSha in a pipeline, after running it again with the
// script loaded when Redis did not know it (NOSCRIPT: a restart, SCRIPT
// FLUSH), and so had not run it.
func (l *Layered) rerunUnknown(ctx context.Context, script *redis.Script, cmd *redis.Cmd, keys []string, args []any) error {
	err := cmd.Err()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		err = script.Run(ctx, l.client, keys, args...).Err()
	}
	return err
}

// WatchSlots implements backend.SlotNotifier: it calls released with the
// layer and key of each announced release of the bucket's slots until ctx
// ends, and all() after each resubscription (announcements may have been
// missed). It shares the client's Pub/Sub connection with Watch; the
// callbacks must not block.
func (l *Layered) WatchSlots(ctx context.Context, released func(layer, key string), all func()) {
	h := joinHub(l.client)
	defer h.leave()
	w := &watcher{changed: all, message: func(payload string) {
		rest, ok := strings.CutPrefix(payload, "slot ")
		if !ok {
			return
		}
		if layer, key, ok := strings.Cut(rest, " "); ok {
			released(layer, key)
		}
	}}
	ch := l.slotsChannel()
	h.add(ctx, ch, w)
	defer h.remove(ch, w)
	<-ctx.Done()
}

var (
	_ backend.SlotStore    = (*Layered)(nil)
	_ backend.SlotNotifier = (*Layered)(nil)
)
