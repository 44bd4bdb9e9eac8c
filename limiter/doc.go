// Package limiter is a token bucket that many processes can share.
//
// A bucket refills at a rate of tokens per second up to its burst. A new
// bucket starts full, and however long it sits idle it never holds more
// than its burst. A message may cost several tokens.
//
// The guide in the repository is docs/library.md; docs/design.md describes
// how the bucket works inside, and the pages named below each feature.
//
// # Stores
//
// The bucket's state lives in a Store. The Redis store (package
// limiter/redislimiter) keeps it in Redis and updates it with one atomic Lua
// script per operation that reads the time from Redis itself, so every
// replica that names the same bucket shares one rate whatever its own clock
// says. NewLocal keeps it in this process, for a single replica and tests;
// a Bucket on Redis uses such a bucket as its local fallback while Redis is
// down.
//
// # Waiting
//
// A Bucket is the handle that consumers use: Wait blocks until tokens are
// granted, Allow takes them only if they are there now, WaitN also passes
// the bucket's layers (per-key limits and quotas, see Layer), and State
// reads the bucket. Waiting is exact: the store either reserves the
// caller's tokens and says when they are due, or says how long to wait
// before asking again (Options.MaxReserve). No call polls on a fixed
// interval. A cancelled wait gives its tokens back to the shared bucket
// (not to the layers, see Bucket.WaitN). A rate change or a
// push-back pause (Pause) that the store announces moves every sleeping
// reservation to where it now falls, keeping the order.
//
// # Layers
//
// A layered store (NewLocal or NewLocalStore with layers, or
// redislimiter's Store.WithLayers) decides the shared bucket and every Layer
// (keyed token buckets, calendar quotas) in one step, for the instant the
// message goes out: all grant, or none is charged. WaitN names the
// message's keys (Request.Keys); a layer that cannot grant in time waits,
// or refuses with a *LimitError under its OnExceed action (dead_letter, or
// delay with a booked slot the message carries back in Request.Paid).
// See docs/layers.md.
//
// # Priority classes
//
// Each request has a class (Priority): Wait and Allow use
// Options.Priority, WaitN its Request.Priority. Across every replica that
// shares the bucket, a waiting request of a higher class gets tokens before
// any of a lower class, whose reservations move back; Options.MinShare
// keeps a floor under a lower class while it waits. See docs/priority.md.
//
// # Adaptive rate
//
// With Options.Adaptive, each push-back (Pause) also multiplies the
// bucket's rate by Adaptive.Decrease, down to Adaptive.MinRate, and the
// rate climbs back while none comes (AIMD), up to the configured rate. The
// adaptive rate is state of the shared bucket, so the whole fleet follows
// it. See docs/adaptive.md.
//
// # Warm-up
//
// A store with a warm-up (redislimiter.Config.Warmup) makes a bucket cold
// on its first use and after an idle period longer than the warm-up: it
// holds a third of its burst and its rate ramps from a third of the rate to
// the rate along Guava's SmoothWarmingUp curve, rate(t) = rate / √(9 −
// 8t/warmup). See docs/adaptive.md.
//
// # Leasing
//
// At high rates a Bucket takes a batch of tokens in one store call and
// spends them locally (LeaseOptions): the batch follows this replica's
// measured demand over a period of max(1% of a second, replicas ÷ 4000
// seconds), so that the fleet's refills stay near 4000 a second however
// many replicas there are; leasing is off below a batch of 8, or of 2
// where the fleet would otherwise call Redis more than 4000 times a
// second. The
// callers of a replica are served first come, first served, from the lease
// or not. A lease serves only the Bucket's own class. See docs/design.md.
//
// # When the store fails
//
// Options.OnStoreError says what a Bucket does while its store fails:
// ModeLocal (the default) limits at this replica's share of the rate, with
// an in-process bucket, until a probe finds the store back; ModeClosed
// grants nothing; ModeOpen grants everything. A store that refuses the
// replica (ErrMisconfigured) closes it whatever the policy. See
// docs/operations.md (Failure modes).
//
// # Concurrency
//
// A Bucket is safe for concurrent use. Close stops its background
// goroutines (heartbeats, probe, lease expiry) and gives back leased
// tokens.
package limiter
