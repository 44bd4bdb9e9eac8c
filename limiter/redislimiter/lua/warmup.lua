-- warmup.lua, included by prelude.lua: the part of the scripts' prelude for the
-- warm-up (Config.Warmup; see the warm-up section of package limiter). The take
-- script sets WARM, the warm-up in µs, from its ARGV[7], and the layers script,
-- for its shared bucket, from its last ARGV; then load() starts a cold bucket's
-- ramp (first use, or no write for longer than WARM: a third of the burst, at
-- least 1, and a third of the rate) or refills along the ramp in progress,
-- setting WTS (the ramp start, saved in the state hash's "wts" field) and WRATE
-- (the rate at now); save() writes WTS and keeps the state key WARM longer, so
-- that a missing key still means idle for longer than the warm-up. The refund
-- scripts (plain and layers) set WARM and WKEEP: load() then refills along a
-- ramp in progress but starts none (limiter's Memory.warmAdvance without
-- start). warm_cum is limiter's warmCum, with the same operations in the same
-- order.

local WARM, WTS, WRATE, WKEEP = nil, nil, nil, nil

local function warm_cum(rate, w, u)
  if u >= w then return rate * w / 2 + rate * (u - w) end
  return rate * w / 4 * (3 - math.sqrt(9 - 8 * u / w))
end

-- warm_load is load() for a take with a warm-up: nil when neither a cold
-- start nor a ramp in progress applies.
local function warm_load(st, now, rate, burst)
  local tokens, ts, wts = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
  if not tokens or not ts or now - ts > WARM then
    if WKEEP then return nil end -- a refund starts no ramp
    WTS, WRATE = now, rate / 3
    return math.min(burst, math.max(1, burst / 3)), now
  end
  if wts and now - wts < WARM then
    WTS = wts
    if now > ts then
      tokens = tokens + (warm_cum(rate, WARM, now - wts) - warm_cum(rate, WARM, ts - wts)) / 1e6
      ts = now
    end
    WRATE = rate / math.sqrt(9 - 8 * (now - wts) / WARM)
    if tokens > burst then tokens = burst end
    return tokens, ts
  end
  return nil
end
