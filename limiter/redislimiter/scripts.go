package redislimiter

import "github.com/redis/go-redis/v9"

// prelude holds the functions every bucket script shares. All times are
// microseconds. The time is read with TIME inside the script, so every
// replica uses the clock of Redis; a test may pass an explicit instant as
// the last argument instead (0 means "use TIME").
const prelude = `
local function now_us(arg)
  local n = tonumber(arg)
  if n and n > 0 then return n end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function limits(okey, rate, burst)
  local ov = redis.call('HMGET', okey, 'rate', 'burst')
  return tonumber(ov[1]) or rate, tonumber(ov[2]) or burst
end

-- load returns the tokens and timestamp at now. A missing bucket is full.
-- The bucket refills only after ts; ts lies in the future while it is paused.
local function load(skey, now, rate, burst)
  local st = redis.call('HMGET', skey, 'tokens', 'ts')
  local tokens, ts = tonumber(st[1]), tonumber(st[2])
  if not tokens or not ts then return burst, now end
  if now > ts then
    tokens = tokens + (now - ts) * rate / 1e6
    ts = now
  end
  if tokens > burst then tokens = burst end
  return tokens, ts
end

-- save stores the state and lets the key expire when the bucket would be
-- full again, when a missing key means exactly the same thing.
local function save(skey, tokens, ts, now, rate, burst)
  redis.call('HSET', skey, 'tokens', tokens, 'ts', ts)
  local full_us = (ts - now) + (burst - tokens) * 1e6 / rate
  redis.call('PEXPIRE', skey, math.ceil(full_us / 1000) + 1000)
end

local function milli(x)
  return math.floor(x * 1000 + 0.5)
end
`

// takeScript takes or reserves tokens.
//
// KEYS: state, override. ARGV: rate, burst, cost, extra, max_wait_us, now_us.
// Reply: {granted (1, 0, or -1 when cost > burst), tokens, wait_us,
// remaining_milli, effective_rate_milli, burst, now_us}.
var takeScript = redis.NewScript(prelude + `
local now = now_us(ARGV[6])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local cost, extra, max_wait = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local tokens, ts = load(KEYS[1], now, rate, burst)
local eff = rate
if ts > now then eff = 0 end
if cost > burst then return {-1, 0, 0, milli(tokens), milli(eff), burst, now} end
local after = tokens - cost
local wait = ts - now
if after < 0 then wait = wait + math.ceil(-after * 1e6 / rate) end
local got = cost
if wait <= 0 then
  wait = 0
  if extra > 0 and after >= 1 then
    local k = math.min(extra, math.floor(after))
    after = after - k
    got = got + k
  end
else
  local horizon = 0
  if max_wait > 0 then horizon = math.max(max_wait, math.ceil(cost * 1e6 / rate)) end
  if wait > horizon then return {0, 0, wait - horizon, milli(tokens), milli(eff), burst, now} end
end
save(KEYS[1], after, ts, now, rate, burst)
return {1, got, wait, milli(after), milli(eff), burst, now}
`)

// refundScript puts tokens back, up to burst.
//
// KEYS: state, override. ARGV: rate, burst, tokens, now_us. Reply: remaining_milli.
var refundScript = redis.NewScript(prelude + `
local now = now_us(ARGV[4])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local tokens, ts = load(KEYS[1], now, rate, burst)
tokens = math.min(burst, tokens + tonumber(ARGV[3]))
save(KEYS[1], tokens, ts, now, rate, burst)
return milli(tokens)
`)

// pauseScript stops refilling and granting until now + d. A longer pause
// already in place is kept. Reservations already made stay valid.
//
// KEYS: state, override. ARGV: rate, burst, d_us, now_us. Reply: paused_us.
var pauseScript = redis.NewScript(prelude + `
local now = now_us(ARGV[4])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local tokens, ts = load(KEYS[1], now, rate, burst)
local untl = now + tonumber(ARGV[3])
if untl > ts then ts = untl end
save(KEYS[1], math.min(tokens, 0), ts, now, rate, burst)
return ts - now
`)

// statusScript reads the bucket without changing it.
//
// KEYS: state, override, replicas. ARGV: rate, burst, now_us.
// Reply: {remaining_milli, effective_rate_milli, burst, paused_us,
// override_rate_milli (or -1), override_burst (or -1), override_ttl_ms,
// replicas}.
var statusScript = redis.NewScript(prelude + `
local now = now_us(ARGV[3])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local tokens, ts = load(KEYS[1], now, rate, burst)
local eff = rate
local paused = 0
if ts > now then eff = 0; paused = ts - now end
local ov = redis.call('HMGET', KEYS[2], 'rate', 'burst')
local orate, oburst = -1, -1
if ov[1] then orate = milli(tonumber(ov[1])) end
if ov[2] then oburst = tonumber(ov[2]) end
local ottl = redis.call('PTTL', KEYS[2])
local replicas = redis.call('ZCOUNT', KEYS[3], string.format('(%d', now), '+inf')
return {milli(tokens), milli(eff), burst, paused, orate, oburst, ottl, replicas}
`)

// fillScript sets the bucket to its effective burst, keeping a pause.
//
// KEYS: state, override. ARGV: rate, burst, now_us. Reply: burst.
var fillScript = redis.NewScript(prelude + `
local now = now_us(ARGV[3])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local tokens, ts = load(KEYS[1], now, rate, burst)
save(KEYS[1], burst, ts, now, rate, burst)
return burst
`)

// heartbeatScript records a live replica and its configured "rate burst",
// forgets the replicas whose heartbeats expired, and counts the live ones.
//
// KEYS: replicas, configs. ARGV: id, ttl_us, now_us, config. Reply: live
// replicas.
var heartbeatScript = redis.NewScript(prelude + `
local now = now_us(ARGV[3])
local ttl = tonumber(ARGV[2])
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('HDEL', KEYS[2], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
local keep = math.ceil(ttl / 1000) * 2
for _, k in ipairs(KEYS) do
  if redis.call('PTTL', k) < keep then redis.call('PEXPIRE', k, keep) end
end
return redis.call('ZCARD', KEYS[1])
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
