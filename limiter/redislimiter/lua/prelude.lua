-- prelude.lua: the functions every bucket script shares. All times are
-- microseconds. The time is read with TIME inside the script, so every
-- replica uses the clock of Redis; a test may pass an explicit instant as
-- the last argument instead (0 means "use TIME").
--
-- Every number a script replies with goes through milli or clamp, which
-- keep it within ±1e15: Redis turns a Lua number into an integer reply with
-- a C cast, which wraps around for larger values. An override that Redis
-- holds outside (0, limiter.MaxRate] or [1, limiter.MaxBurst], written by
-- something other than SetOverride, is ignored: the replica's configured
-- values apply.
--
-- A script is the prelude followed by its body (refund.lua, pause.lua, ...);
-- the layer scripts add layer_prelude.lua. {{MAXRATE}} and {{MAXBURST}} are
-- limiter.MaxRate and limiter.MaxBurst; a line {{name.lua}} is that file.

local MAXRATE = {{MAXRATE}}
local MAXBURST = {{MAXBURST}}
{{adaptive.lua}}
{{warmup.lua}}
{{math.lua}}


local function milli(x)
  return clamp(math.floor(x * 1000 + 0.5))
end

-- num returns x as the string Redis would store for it (%.17g), made with
-- %d when whole, which is cheaper than letting Redis format a Lua number.
local function num(x)
  if x == math.floor(x) and x > -1e15 and x < 1e15 then return string.format('%d', x) end
  return string.format('%.17g', x)
end
{{priority.lua}}


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
-- rate at NOW below that ceiling when the hash holds one (adaptive.lua).
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
-- It reads the classes' state in the same HMGET (priority.lua), and the
-- key's expiry as save() last set it (RX, ms on Redis's clock). st, when
-- given, holds those fields as already read (the take's fast path), in
-- the order of the HMGET below.
local function load(skey, now, rate, burst, st)
  if not st then
    st = redis.call('HMGET', skey, 'tokens', 'ts', 'wts', 'x', 'q0', 'q2', 'p1', 'p2', 'j1', 'j2')
  end
  local o = 5
  RX = tonumber(st[4])
  if st[o] or st[o + 1] or st[o + 2] or st[o + 3] or st[o + 4] or st[o + 5] then -- priority.lua
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
-- take_fast.lua has the same arithmetic.
local function save(skey, tokens, ts, now, rate, burst)
  local full_us = (ts - now) + (burst - tokens) * 1e6 / rate
  if WARM then -- warmup.lua: the ramp start, and "missing" = idle longer than WARM
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

