package redislimiter

import "github.com/redis/go-redis/v9"

// mathLua holds clamp and wait_us (lua/math.lua): the prelude's, and those
// of layersKeyedScript, which does without the rest of the prelude.
var mathLua = luaSource("math.lua")

// prelude holds the functions every bucket script shares (lua/prelude.lua,
// which includes adaptive.lua, warmup.lua, math.lua and priority.lua): a
// script is the prelude followed by its body. All times are microseconds,
// read with TIME inside the script.
var prelude = luaSource("prelude.lua")

// takeScript takes or reserves tokens: lua/take_fast.lua, the prelude, then
// lua/take.lua, whose header documents its KEYS, ARGV and reply (one string
// of nine integers, or the fast path's shorter ones).
var takeScript = redis.NewScript(takeSrc)

var takeSrc = takeFastLua + prelude + luaSource("take.lua")

// refundScript puts tokens back, up to burst, and takes them off the queue
// of the rank that reserved them (priorityLua).
//
// KEYS: state, override. ARGV: rate, burst, tokens, now_us, rank (0, or
// absent: no class), warmup_us (0 or absent: none; the bucket refills along
// a ramp in progress but starts none, warmupLua). Reply: remaining_milli.
var refundScript = redis.NewScript(prelude + `
local now = now_us(ARGV[4])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
WARM, WKEEP = tonumber(ARGV[6]), true -- warmupLua
if WARM and WARM <= 0 then WARM = nil end
local tokens, ts = load(KEYS[1], now, rate, burst)
local k = tonumber(ARGV[3])
tokens = math.min(burst, tokens + k)
prio_refund(tonumber(ARGV[5]) or 0, k)
save(KEYS[1], tokens, ts, now, rate, burst)
return milli(tokens)
`)

// pauseScript stops refilling and granting until now + d, and announces
// it. A longer pause already in place is kept. Reservations already made
// stay valid.
//
// KEYS: state, override. ARGV: rate, burst, d_us, now_us, channel, by (the
// pausing replica, recorded in the state's "by" field when this pause is
// the longer). Reply: paused_us.
var pauseScript = redis.NewScript(prelude + `
local now = now_us(ARGV[4])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local tokens, ts = load(KEYS[1], now, rate, burst)
local untl = now + tonumber(ARGV[3])
local longer = untl > ts
if longer then ts = untl end
save(KEYS[1], math.min(tokens, 0), ts, now, rate, burst)
if longer then redis.call('HSET', KEYS[1], 'by', ARGV[6]) end
redis.call('PUBLISH', ARGV[5], 'pause')
return clamp(ts - now)
`)

// statusScript reads the bucket without changing it. The configured rate
// and burst may be 0 for "unknown" (an Admin without them); then the
// effective ones are known only from a valid override, and the tokens only
// when both are known.
//
// KEYS: state, override, replicas. ARGV: rate, burst, now_us.
// Reply: {tokens_milli (or false when unknown), effective_rate_milli (the
// refill rate apart from a pause, 0 when unknown), burst (0 when unknown),
// paused_us, override_rate (verbatim, or false), override_burst (verbatim,
// or false), override_ttl_ms, replicas, now_us, paused_by ("" when not
// paused or unknown), reserved0_milli, reserved1_milli, reserved2_milli
// (the tokens each rank holds reserved ahead), pushed1_milli, pushed2_milli
// (the push counters of ranks 1 and 2); the last five are 0 when the
// tokens are unknown}.
var statusScript = redis.NewScript(prelude + `
local now = now_us(ARGV[3])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local st = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'by')
local paused, by = 0, ''
local ts = tonumber(st[2])
if ts and ts > now then paused = clamp(ts - now); by = st[3] or '' end
local tokens = false
local r0, r1, r2 = 0, 0, 0
if rate > 0 and burst > 0 then -- load reads the classes' state (priorityLua)
  local t = load(KEYS[1], now, rate, burst)
  tokens = milli(t)
  r0, r2 = Q0, Q2
  r1 = math.max(0, -t) - Q0 - Q2
  if r1 < ` + minQueuedLua + ` then r1 = 0 end
end
local ov = redis.call('HMGET', KEYS[2], 'rate', 'burst')
local ottl = redis.call('PTTL', KEYS[2])
local replicas = redis.call('ZCOUNT', KEYS[3], string.format('(%d', now), '+inf')
return {tokens, milli(rate), burst, paused, ov[1] or false, ov[2] or false, ottl, replicas, now, by,
  milli(r0), milli(r1), milli(r2), milli(P1), milli(P2)}
`)

// drainScript empties the bucket and leaves at least debt tokens reserved
// ahead (tokens = min(tokens, -debt)), keeping a pause, and announces it: replicas still in fallback then probe at once.
//
// KEYS: state, override. ARGV: rate, burst, debt, now_us, channel. Reply:
// remaining_milli.
var drainScript = redis.NewScript(prelude + `
local now = now_us(ARGV[4])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local t0, ts = load(KEYS[1], now, rate, burst)
local tokens = math.min(t0, -math.max(tonumber(ARGV[3]), 0))
Q0 = Q0 + (math.max(0, -tokens) - math.max(0, -t0)) -- the debt is at the front (priorityLua)
save(KEYS[1], tokens, ts, now, rate, burst)
redis.call('PUBLISH', ARGV[5], 'recovered')
return milli(tokens)
`)

// setOverrideScript replaces the override and announces it.
//
// KEYS: override. ARGV: rate, burst (0: keep the configured burst), ttl_ms
// (0: none), channel.
var setOverrideScript = redis.NewScript(`
redis.call('DEL', KEYS[1])
if tonumber(ARGV[2]) > 0 then
  redis.call('HSET', KEYS[1], 'rate', ARGV[1], 'burst', ARGV[2])
else
  redis.call('HSET', KEYS[1], 'rate', ARGV[1])
end
if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
redis.call('PUBLISH', ARGV[4], 'override')
return 1
`)

// deleteScript deletes KEYS and announces ARGV[2] on channel ARGV[1]. It
// clears an override and resets a bucket.
var deleteScript = redis.NewScript(`
redis.call('DEL', unpack(KEYS))
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
`)

// leaveScript removes a replica from the heartbeat set.
//
// KEYS: replicas, configs. ARGV: id.
var leaveScript = redis.NewScript(`
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
`)

// fillScript fills the bucket to its effective burst, keeping a pause, and
// announces it. When the burst is unknown (0: an Admin without configured
// limits and no override burst), a bucket that is not paused loses its
// state, which means full to every replica's own burst, and a paused one
// is filled to MaxBurst, which every replica caps at its own burst.
//
// KEYS: state, override. ARGV: rate, burst, now_us, channel. Reply: 1.
var fillScript = redis.NewScript(prelude + `
local now = now_us(ARGV[3])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local st = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local ts = tonumber(st[2])
local paused = ts and ts > now
if rate > 0 and burst > 0 then
  local _, lts = load(KEYS[1], now, rate, burst)
  save(KEYS[1], burst, lts, now, rate, burst)
elseif paused then
  local keep = math.ceil((ts - now) / 1000) + 1000
  redis.call('HSET', KEYS[1], 'tokens', MAXBURST, 'ts', ts, 'x', string.format('%d', real_ms() + keep - 1))
  redis.call('PEXPIRE', KEYS[1], keep)
else
  redis.call('DEL', KEYS[1])
end
redis.call('PUBLISH', ARGV[4], 'fill')
return 1
`)

// heartbeatScript records a live replica and its configured "rate burst"
// (with its report, when it sends one) followed by " a:NOW_US", the
// instant of the beat on Redis's clock, forgets the replicas whose
// heartbeats expired, and counts the live ones.
//
// KEYS: replicas, configs. ARGV: id, ttl_us, now_us, config, count ("1":
// count the consumers too). Reply: live replicas; with count,
// {live, consuming}, consuming being the live replicas whose config has no
// "idle" token.
var heartbeatScript = redis.NewScript(prelude + `
local now = now_us(ARGV[3])
local ttl = tonumber(ARGV[2])
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('HDEL', KEYS[2], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4] .. string.format(' a:%d', now))
local keep = math.ceil(ttl / 1000) * 2
for _, k in ipairs(KEYS) do
  if redis.call('PTTL', k) < keep then redis.call('PEXPIRE', k, keep) end
end
local live = redis.call('ZCARD', KEYS[1])
if ARGV[5] ~= '1' then return live end
local consuming = 0
for _, c in ipairs(redis.call('HMGET', KEYS[2], unpack(redis.call('ZRANGE', KEYS[1], 0, -1)))) do
  if not (c and string.find(' ' .. c .. ' ', ' idle ', 1, true)) then consuming = consuming + 1 end
end
return {live, consuming}
`)

// replicasScript lists the live replicas with their configured "rate burst"
// ("" when unknown).
//
// KEYS: replicas, configs. ARGV: now_us. Reply: {id, config, id, config...}.
var replicasScript = redis.NewScript(prelude + `
local now = now_us(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('(%d', now), '+inf')
local out = {}
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[2], id) or ''
end
return out
`)
