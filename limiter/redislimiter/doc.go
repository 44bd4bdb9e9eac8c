// Package redislimiter keeps a limiter bucket in Redis, shared by every
// replica that names it. New returns the Store a program gives to
// limiter.New; Store.WithLayers adds layers (keyed buckets and quotas, see
// Layered); Admin is an operator's side. How it works as a whole (the
// algorithm, the layered decision, every key and script) is described in
// docs/design.md in the repository.
//
// # Scripts
//
// Each operation is one Lua script, run atomically with EVALSHA (falling back
// to EVAL when Redis does not have the script yet). The scripts read the time
// with the Redis TIME command, so the bucket never depends on a replica's
// clock: replicas whose clocks are minutes apart share the rate exactly. The
// scripts live in lua/*.lua, embedded; each file's header gives its KEYS,
// ARGV and reply.
//
// Concurrent Take calls on one Store are batched: while one is in flight,
// those that arrive queue up and go out together as one pipeline when it
// returns. See Config.NoBatching.
//
// # Keys
//
// A bucket named NAME uses these keys, all with the hash tag {NAME} so that
// they land in one Redis Cluster slot and one script can touch them all:
//
//	PREFIX{NAME}:state     hash: tokens, ts (µs), by (who paused),  TTL: until the bucket is full again, or a little later
//	                       the classes' q0 q2 p1 p2 j1 j2 (see lua/priority.lua),
//	                       x (the TTL's end as last set, ms; see save)
//	PREFIX{NAME}:override  hash: rate, burst                       TTL: the override's duration, if any
//	PREFIX{NAME}:replicas  sorted set: replica → expiry             TTL: twice the heartbeat TTL
//	PREFIX{NAME}:configs   hash: replica → "rate burst [mode granted waiting x:LAYER:N... w:H,N,L idle] a:BEAT_US"  TTL: as replicas
//	PREFIX{NAME}:idle      sorted set: idle replica → expiry        TTL: as replicas
//	PREFIX{NAME}:paid-secret  string: the secret that signs paid slots (see PaidSecret)  no TTL
//
// and announce changes on the Pub/Sub channel PREFIX{NAME}:changes (see
// Watch). PREFIX defaults to "throttle:". A missing state key means a full
// bucket, so the TTL only ever removes state that no longer matters; for
// the same reason a take after which the bucket is full again within a
// microsecond writes no state at all (takeFastLua). An
// override holding values outside (0, 1e9] tokens per second or [1,
// 2^31−1] is ignored by the scripts and shown by Admin.Status.
// The keys of layers are listed under Layered.
//
// # Operators and errors
//
// Store is a replica's side; Admin is an operator's, and needs no
// configured limits: status, override, fill and reset, each change
// announced on the bucket's channel. Buckets lists the buckets in Redis.
// Config.Validate checks a configuration before there is a client.
//
// Every error of a Redis call matches limiter.ErrStore (errors.Is), names
// the bucket and the operation, and unwraps to go-redis's error; those
// that waiting will not cure (credentials, ACL permissions, scripts
// disabled, a wrong db) also match limiter.ErrMisconfigured.
package redislimiter
