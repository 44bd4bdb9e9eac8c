package redislimiter

import (
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/limiter"
)

// mathLua holds clamp and wait_us: the prelude's, and those of
// layersKeyedScript, which does without the rest of the prelude.
const mathLua = `
local function clamp(x)
  if x ~= x then return 0 end
  if x > 1e15 then return 1e15 end
  if x < -1e15 then return -1e15 end
  return x
end

-- wait_us returns the microseconds needed to refill n tokens at rate.
local function wait_us(n, rate)
  return clamp(math.ceil(n * 1e6 / rate))
end
`

// prelude holds the functions every bucket script shares. All times are
// microseconds. The time is read with TIME inside the script, so every
// replica uses the clock of Redis; a test may pass an explicit instant as
// the last argument instead (0 means "use TIME").
//
// Every number a script replies with goes through milli or clamp, which
// keep it within ±1e15: Redis turns a Lua number into an integer reply with
// a C cast, which wraps around for larger values. An override that Redis
// holds outside (0, limiter.MaxRate] or [1, limiter.MaxBurst], written by
// something other than SetOverride, is ignored: the replica's configured
// values apply.
var prelude = `
local MAXRATE = ` + strconv.FormatFloat(limiter.MaxRate, 'g', -1, 64) + `
local MAXBURST = ` + strconv.Itoa(limiter.MaxBurst) + `
` + adaptiveLua + warmupLua + mathLua + `

local function milli(x)
  return clamp(math.floor(x * 1000 + 0.5))
end

-- num returns x as the string Redis would store for it (%.17g), made with
-- %d when whole, which is cheaper than letting Redis format a Lua number.
local function num(x)
  if x == math.floor(x) and x > -1e15 and x < 1e15 then return string.format('%d', x) end
  return string.format('%.17g', x)
end
` + priorityLua + `

-- REALMS is Redis's clock in ms, which key expiries follow: set by now_us
-- when it reads TIME, else read by real_ms when needed (a test's instant).
local REALMS = nil

local function now_us(arg)
  local n = tonumber(arg)
  if not (n and n > 0) then
    local t = redis.call('TIME')
    n = tonumber(t[1]) * 1000000 + tonumber(t[2])
    REALMS = math.floor(n / 1000)
  end
  NOW = n -- adaptive: limits() computes the rate at NOW
  return n
end

local function real_ms()
  if not REALMS then
    local t = redis.call('TIME')
    REALMS = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
  end
  return REALMS
end

-- RX is the state key's expiry as save() last recorded it in the "x"
-- field (ms on Redis's clock), read by load(); nil when none.
local RX = nil

-- valid_rate and valid_burst return their argument as a number if it is
-- within the limits, else nil. NaN fails every comparison.
local function valid_rate(v)
  local r = tonumber(v)
  if r and r > 0 and r <= MAXRATE then return r end
  return nil
end

local function valid_burst(v)
  local b = tonumber(v)
  if b and b >= 1 and b <= MAXBURST then return math.floor(b) end
  return nil
end

-- limits returns the effective rate and burst: the override's where it
-- holds a valid value, else the configured ones; the rate is the adaptive
-- rate at NOW below that ceiling when the hash holds one (adaptiveLua).
-- none true says the override hash is known to be missing (the take's
-- fast path checked), so it is not read.
local function limits(okey, rate, burst, none)
  if none then
    CEIL = rate
    return rate, burst
  end
  local ov = redis.call('HMGET', okey, 'rate', 'burst', 'arate', 'ats', 'ainc')
  CEIL = valid_rate(ov[1]) or rate
  AD = ad_from(ov, CEIL)
  if AD then return ad_rate(AD, NOW), valid_burst(ov[2]) or burst end
  return CEIL, valid_burst(ov[2]) or burst
end

-- load returns the tokens and timestamp at now. A missing bucket is full.
-- The bucket refills only after ts; ts lies in the future while it is paused.
-- It reads the classes' state in the same HMGET (priorityLua), and the
-- key's expiry as save() last set it (RX, ms on Redis's clock). st, when
-- given, holds those fields as already read (the take's fast path), in
-- the order of the HMGET below.
local function load(skey, now, rate, burst, st)
  if not st then
    st = redis.call('HMGET', skey, 'tokens', 'ts', 'wts', 'x', 'q0', 'q2', 'p1', 'p2', 'j1', 'j2')
  end
  local o = 5
  RX = tonumber(st[4])
  if st[o] or st[o + 1] or st[o + 2] or st[o + 3] or st[o + 4] or st[o + 5] then -- priorityLua
    RQ0, RQ2, RP1, RP2 = tonumber(st[o]), tonumber(st[o + 1]), tonumber(st[o + 2]), tonumber(st[o + 3])
    RJ1, RJ2 = tonumber(st[o + 4]), tonumber(st[o + 5])
    Q0, Q2, P1, P2, J1, J2 = RQ0 or 0, RQ2 or 0, RP1 or 0, RP2 or 0, RJ1, RJ2
  end
  if WARM then
    local wt, wts = warm_load(st, now, rate, burst)
    if wt then
      prio_refilled(tonumber(st[1]), wt, burst)
      return wt, wts
    end
  end
  local tokens, ts = tonumber(st[1]), tonumber(st[2])
  if not tokens or not ts then
    prio_refilled(nil, burst, burst)
    return burst, now
  end
  local t0 = tokens
  if now > ts then
    if AD then
      tokens = tokens + (ad_cum(AD, now) - ad_cum(AD, ts)) / 1e6
    else
      tokens = tokens + (now - ts) * rate / 1e6
    end
    ts = now
  end
  if tokens > burst then tokens = burst end
  prio_refilled(t0, tokens, burst)
  return tokens, ts
end

-- save stores the state, with the classes' fields that changed, and lets
-- the key expire once the bucket would be full again, when a missing key
-- means exactly the same thing. It may live a little longer: the expiry
-- is extended only when the one recorded in the "x" field (RX) comes less
-- than 100 ms after the bucket is full, so most calls skip PEXPIRE; it is
-- then set to a second after full, plus a quarter of the time to refill
-- the tokens reserved ahead, so that a growing queue extends it rarely.
-- takeFastLua has the same arithmetic.
local function save(skey, tokens, ts, now, rate, burst)
  local full_us = (ts - now) + (burst - tokens) * 1e6 / rate
  if WARM then -- warmupLua: the ramp start, and "missing" = idle longer than WARM
    if WTS then redis.call('HSET', skey, 'wts', string.format('%d', WTS), 'wu', string.format('%d', WARM)) end
    full_us = full_us + WARM
  end
  local full, rms = math.ceil(full_us / 1000), real_ms()
  if RX and RX >= rms + full + 100 then
    prio_hset(skey, tokens, ts, burst)
  else
    local keep = full + 1000
    if tokens < 0 then keep = keep + math.floor(-tokens * 250 / rate) end
    prio_hset(skey, tokens, ts, burst, string.format('%d', rms + keep - 1))
    redis.call('PEXPIRE', skey, string.format('%d', keep))
  end
end

`

// takeScript takes or reserves tokens.
//
// KEYS: state, override. ARGV: rate, burst, cost, extra, max_wait_us, now_us,
// warmup_us (0 or absent: none; see warmupLua), rank (the class's rank,
// limiter.Priority.Rank; absent: 1), share1, share2 (the MinShare of ranks 1
// and 2; absent: 0), channel (for the push announcement). Reply: one string
// of nine integers separated by spaces: granted (1, 0, -1 when cost >
// burst, or 2 when a lower rank's MinShare refused it: wait_us is then the
// time until it would not), tokens, wait_us, remaining_milli,
// effective_rate_milli, burst, now_us, rank (whose queue holds the
// reservation), pushed_milli (that rank's push counter). One string costs the client two
// allocations to read, where an array of nine integers costs up to eleven.
var takeScript = redis.NewScript(takeSrc)

var takeSrc = takeFastLua + prelude + `
local now = now_us(TAKE_NOW)
REALMS = TAKE_REAL
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), TAKE_NOOV)
local cost, extra, max_wait = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local rank, s1, s2 = tonumber(ARGV[8]) or 1, tonumber(ARGV[9]) or 0, tonumber(ARGV[10]) or 0
WARM = tonumber(ARGV[7]) -- warmupLua
if WARM and WARM <= 0 then WARM = nil end
local tokens, ts = load(KEYS[1], now, rate, burst, TAKE_ST)
if WRATE then rate = WRATE end -- warmupLua: a cold start or a ramp in progress
local eff = rate
if ts > now then eff = 0 end
local pushed, visible, q1, need = prio_class(tokens, rank, cost, s1, s2, burst)
local function reply(granted, got, wait, remaining)
  local p = 0
  if rank == 1 then p = P1 elseif rank == 2 then p = P2 end
  return string.format('%d %d %d %d %d %d %d %d %d', granted, got, wait, milli(remaining), milli(eff), burst, now, rank, milli(p))
end
if cost > burst then return reply(-1, 0, 0, tokens) end
if need > 0 then return reply(2, 0, clamp((ts - now) + wait_us(need, rate)), tokens) end
local after = visible - cost
local wait = ts - now
if after < 0 then wait = clamp(wait + wait_us(-after, rate)) end
local got, left = cost, tokens - cost
if wait <= 0 then
  wait = 0
  if extra > 0 and left >= 1 then
    local k = math.min(extra, math.floor(left))
    left = left - k
    got = got + k
  end
else
  local horizon = 0
  if max_wait > 0 then horizon = math.max(max_wait, wait_us(cost, rate)) end
  if wait > horizon then return reply(0, 0, wait - horizon, tokens) end
end
prio_grant(rank, pushed, q1, s1, s2, burst, ARGV[11], now)
save(KEYS[1], left, ts, now, rate, burst)
return reply(1, got, wait, left)
`

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
