package redislimiter

import "github.com/redis/go-redis/v9"

// layerPrelude holds the functions of the layer scripts. A layer's state is
// one string key: "tokens ts" for a keyed bucket (ts in µs), "window_end
// used" for a quota. Numbers go through %.17g so that a token count survives
// a round trip exactly, as it does in the in-process store.
var layerPrelude = prelude + `
local function num2(v)
  if not v then return nil, nil end
  local a, b = string.match(v, '^(%S+) (%S+)$')
  return tonumber(a), tonumber(b)
end

-- bucket_load returns a layer bucket's tokens and timestamp at now. A
-- missing key is a full bucket.
local function bucket_load(key, now, rate, burst)
  local tokens, ts = num2(redis.call('GET', key))
  if not tokens or not ts then return burst, now end
  if now > ts then
    tokens = tokens + (now - ts) * rate / 1e6
    ts = now
  end
  if tokens > burst then tokens = burst end
  return tokens, ts
end

-- bucket_save stores a layer bucket that expires when it is full again.
local function bucket_save(key, tokens, ts, now, rate, burst)
  local full_us = (ts - now) + (burst - tokens) * 1e6 / rate
  redis.call('SET', key, string.format('%.17g %.17g', tokens, ts), 'PX', math.ceil(full_us / 1000) + 1000)
end

-- bucket_wait returns a layer bucket's tokens and timestamp at now, and
-- the µs until it holds cost tokens (0 when it holds them now).
local function bucket_wait(key, now, cost, rate, burst)
  local tokens, ts = bucket_load(key, now, rate, burst)
  local wt = ts - now
  local after = tokens - cost
  if after < 0 then wt = clamp(wt + wait_us(-after, rate)) end
  if wt < 0 then wt = 0 end
  return tokens, ts, wt
end

-- paid_flags returns, from a string of one instant in µs per layer
-- separated by spaces (see paidArg), which layers the request passes on a
-- slot it already paid for at now: those whose instant is not 0 nor before
-- now. Such a layer waits 0 and is charged paid_charge. A request without
-- paid slots ("", most of them) gets the shared empty table.
local NO_PAID = {}
local function paid_flags(s, now)
  if not s or s == '' then return NO_PAID end
  local p, i = {}, 0
  for d in string.gmatch(s, '%d+') do
    i = i + 1
    local u = tonumber(d)
    p[i] = u > 0 and now <= u
  end
  return p
end

-- send_charge returns a layer bucket's tokens, as of ts, after a request
-- of cost that goes out at send (µs) took from it (limiter's sendCharge):
-- the tokens it holds at send, never more than burst, less the cost, or
-- for a layer passed on a paid slot (paid) less the excess of a late slot.
local function send_charge(tokens, ts, send, cost, paid, rate, burst)
  local ahead = send - ts
  if ahead < 0 then ahead = 0 end
  ahead = ahead * rate / 1e6
  local at = tokens + ahead
  if at > burst then at = burst end
  local c = cost
  if paid then
    c = at + cost - burst
    if c < 0 then c = 0 end
  end
  return at - c - ahead
end

-- refused_status returns the status of a refusal by layer i (see
-- layersScript): 4 after booking the request's slot on i, as a token-bucket
-- layer with action delay does (limiter.ReservesOnRefusal), else 2.
local function refused_status(i, key, kind, action, w, tok, lts, cost, now, rate, burst)
  if action == 'y' and kind ~= 'q' and w < 1e15 then
    bucket_save(key, tok - cost, lts, now, rate, burst)
    return 4
  end
  return 2
end

-- refusal returns the layer (1..n) that refuses a request whose layers
-- would wait w, or 0: a layer whose action is not wait (w) refuses when
-- its wait is above its max wait; dead_letter (d) wins over delay (y), and
-- among delay layers the longest wait.
local function refusal(n, action, w, maxw)
  local refused = 0
  for i = 1, n do
    if action[i] ~= 'w' and w[i] > maxw[i] then
      if action[i] == 'd' then
        if refused == 0 or action[refused] ~= 'd' then refused = i end
      elseif refused == 0 or (action[refused] == 'y' and w[i] > w[refused]) then
        refused = i
      end
    end
  end
  return refused
end

-- quota_used returns the tokens used in the window ending at e.
local function quota_used(key, e)
  local se, su = num2(redis.call('GET', key))
  if se == e and su then return su end
  return 0
end

local function quota_save(key, e, used, now)
  redis.call('SET', key, string.format('%.17g %d', e, used), 'PX', math.ceil((e - now) / 1000) + 1000)
end

-- window_end returns the end of the window among the boundaries
-- b0 < b1 < b2 < b3 (ARGV[a..a+3]) that holds now, or nil.
local function window_end(a, now)
  for j = 0, 2 do
    local s, e = tonumber(ARGV[a + j]), tonumber(ARGV[a + j + 1])
    if now >= s and now < e then return e end
  end
  return nil
end
`

// layersScript decides the shared bucket (optionally) and layers in one
// atomic step: all grant and are charged, or none is. It mirrors
// limiter.LayeredMemory.TakeLayersAt line by line.
//
// KEYS: with the shared bucket, its state and override keys; then one key
// per layer. ARGV: now_us (0: TIME), cost, horizon_us, shared (1/0),
// shared rate, shared burst, n, extra (shared tokens to lease when all is
// granted at once), rank, share1, share2, channel (the class on the shared
// bucket, as in takeScript); then 10 values per layer: index (1-based,
// named in the reply), kind (b: bucket, q: quota), rate or quota, burst,
// action (w: wait, d: dead_letter, y: delay), max_wait_us, and for a quota
// four window boundaries b0..b3 around the caller's clock (0 for a bucket);
// then the shared bucket's warm-up in µs (0 or absent: none), which ramps
// the shared part as it ramps takeScript (warmupLua); last, the paid
// layers: for each layer, separated by spaces, the last instant in µs at
// which the request passes it on a slot it already paid for
// (limiter.PaidUntil), or 0; "" for none. Such a layer, at or before its
// instant, waits 0 and is charged only the excess of a late slot
// (limiter.PaidCharge).
//
// Reply: {status, wait_us, layer, remaining_milli, effective_rate_milli,
// burst, now_us, tokens (cost plus the extra granted), rank, pushed_milli
// (its push counter on the shared bucket), layers_due_us (granted: when
// every layer had room, limiter.LayerResult.LayersDue)}. status: 1 granted, 0 not
// granted (come back after wait_us), 2 refused by layer's action, 4
// refused by layer, a token bucket with action delay, which booked the
// request's tokens for wait_us on itself alone (limiter.ReservesOnRefusal),
// 3 refused by a lower rank's MinShare on the shared bucket (wait_us until
// it would not), -1 cost above the shared burst, -2 cost above layer's burst or
// quota, -3 no window holds now (a clock skew above a window). layer is
// the 1-based index of the layer that set wait_us or refused, or 0 for the
// shared bucket.
var layersScript = redis.NewScript(layerPrelude + `
local now = now_us(ARGV[1])
local cost, horizon = tonumber(ARGV[2]), tonumber(ARGV[3])
local shared = ARGV[4] == '1'
local n = tonumber(ARGV[7])
local extra = tonumber(ARGV[8])
local rank, s1, s2 = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local kb = 0
local srate, sburst, stokens, sts, safter, wait0, eff = 0, 0, 0, 0, 0, 0, 0
local pushed, visible, q1, need = 0, 0, 0, 0
local function reply(status, wait, layer, remaining, got, due)
  local p = 0
  if rank == 1 then p = P1 elseif rank == 2 then p = P2 end
  return {status, wait, layer, milli(remaining), milli(eff), sburst, now, got, rank, milli(p), due or 0}
end
if shared then
  kb = 2
  srate, sburst = limits(KEYS[2], tonumber(ARGV[5]), tonumber(ARGV[6]))
  WARM = tonumber(ARGV[13 + 10 * n]) -- warmupLua, as in takeScript
  if WARM and WARM <= 0 then WARM = nil end
  stokens, sts = load(KEYS[1], now, srate, sburst)
  if WRATE then srate = WRATE end -- a cold start or a ramp in progress
  pushed, visible, q1, need = prio_class(stokens, rank, cost, s1, s2, sburst)
  eff = srate
  if sts > now then eff = 0 end
  if cost > sburst then return reply(-1, 0, 0, stokens, 0) end
  if need > 0 then return reply(3, clamp((sts - now) + wait_us(need, srate)), 0, stokens, 0) end
  safter = stokens - cost
  wait0 = sts - now
  if visible - cost < 0 then wait0 = clamp(wait0 + wait_us(-(visible - cost), srate)) end
  if wait0 < 0 then wait0 = 0 end
  if horizon > 0 then horizon = math.max(horizon, wait_us(cost, srate)) end
else
  wait0 = horizon -- without the shared bucket: when the message goes out
end
-- Every layer is decided and charged at send, when the shared bucket's
-- reservation is due (send_charge).
local send = now + wait0

local idx, kind, rate, burst, action, maxw = {}, {}, {}, {}, {}, {}
local tok, lts, wend, used, w = {}, {}, {}, {}, {}
local paid = paid_flags(ARGV[14 + 10 * n], send)
for i = 1, n do
  local a = 12 + (i - 1) * 10
  local key = KEYS[kb + i]
  idx[i], kind[i] = tonumber(ARGV[a + 1]), ARGV[a + 2]
  rate[i], burst[i] = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  action[i], maxw[i] = ARGV[a + 5], tonumber(ARGV[a + 6])
  if paid[i] then
    tok[i], lts[i] = bucket_load(key, now, rate[i], burst[i])
    w[i] = 0
  elseif kind[i] == 'q' then
    local quota = rate[i]
    if cost > quota then return reply(-2, 0, idx[i], stokens, 0) end
    local we = window_end(a + 7, send)
    if not we then return reply(-3, 0, idx[i], stokens, 0) end
    wend[i] = we
    used[i] = quota_used(key, we)
    w[i] = 0
    if used[i] + cost > quota then w[i] = we - now end
  else
    if cost > burst[i] then return reply(-2, 0, idx[i], stokens, 0) end
    tok[i], lts[i], w[i] = bucket_wait(key, now, cost, rate[i], burst[i])
  end
end

local refused = refusal(n, action, w, maxw)
if refused > 0 then
  local r = refused
  return reply(refused_status(r, KEYS[kb + r], kind[r], action[r], w[r], tok[r], lts[r], cost, now, rate[r], burst[r]), w[r], idx[r], stokens, 0)
end

-- A layer without room at send: come back when it has room, charging
-- nothing (a quota's room is its next window). Else a shared wait beyond
-- the horizon comes back when it fits.
local wait, limiting, due = wait0, 0, 0
for i = 1, n do
  if w[i] > wait then wait, limiting = w[i], idx[i] end
  if w[i] > due then due = w[i] end
end
if limiting > 0 then return reply(0, wait, limiting, stokens, 0) end
if shared and wait > horizon then return reply(0, wait - horizon, 0, stokens, 0) end

local got = cost
if shared then
  if wait == 0 and extra > 0 and safter >= 1 then
    local k = math.min(extra, math.floor(safter))
    safter = safter - k
    got = got + k
  end
  prio_grant(rank, pushed, q1, s1, s2, sburst, ARGV[12], now)
  save(KEYS[1], safter, sts, now, srate, sburst)
end
for i = 1, n do
  local key = KEYS[kb + i]
  if kind[i] == 'q' then
    quota_save(key, wend[i], used[i] + cost, now)
  else
    local after = send_charge(tok[i], lts[i], send, cost, paid[i], rate[i], burst[i])
    if after ~= tok[i] then bucket_save(key, after, lts[i], now, rate[i], burst[i]) end
  end
end
return reply(1, wait, limiting, safter, got, due)
`)

// layersRefundScript gives back what layersScript charged. A quota is
// refunded only while its stored window is the one charged.
//
// KEYS: as layersScript. ARGV: now_us, cost, shared (1/0), shared rate,
// shared burst, n, rank (whose queue on the shared bucket held the
// reservation); then 4 values per layer: kind, rate or quota, burst, and
// for a quota the end of the window charged; last, the warm-up in µs, as
// in layersScript: the shared bucket refills along a ramp in progress up to
// now (but a refund starts no ramp), and its key lives the warm-up longer.
// Reply: 1.
var layersRefundScript = redis.NewScript(layerPrelude + `
local now = now_us(ARGV[1])
local cost = tonumber(ARGV[2])
local n = tonumber(ARGV[6])
local kb = 0
if ARGV[3] == '1' then
  kb = 2
  local rate, burst = limits(KEYS[2], tonumber(ARGV[4]), tonumber(ARGV[5]))
  WARM, WKEEP = tonumber(ARGV[8 + 4 * n]), true -- warmupLua: along a ramp, starting none
  if WARM and WARM <= 0 then WARM = nil end
  local tokens, ts = load(KEYS[1], now, rate, burst)
  prio_refund(tonumber(ARGV[7]), cost)
  save(KEYS[1], math.min(burst, tokens + cost), ts, now, rate, burst)
end
for i = 1, n do
  local a = 7 + (i - 1) * 4
  local key = KEYS[kb + i]
  local r, b = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  if ARGV[a + 1] == 'q' then
    local e = tonumber(ARGV[a + 4])
    local se, su = num2(redis.call('GET', key))
    if se == e and su and e > now then
      quota_save(key, e, math.max(0, su - cost), now)
    end
  else
    local tokens, ts = bucket_load(key, now, r, b)
    bucket_save(key, math.min(b, tokens + cost), ts, now, r, b)
  end
end
return 1
`)

// layerStatusScript reads one key of a layer.
//
// KEYS: the layer's key. ARGV: kind, rate or quota, burst, b0..b3, now_us.
// Reply: {tokens_milli (bucket) or used (quota), window_end_us (quota, 0
// for a bucket; -1 when no window holds now), now_us, kept (1 when the key
// exists)}.
var layerStatusScript = redis.NewScript(layerPrelude + `
local now = now_us(ARGV[8])
local kept = redis.call('EXISTS', KEYS[1])
if ARGV[1] == 'q' then
  local e = window_end(4, now)
  if not e then return {0, -1, now, kept} end
  return {quota_used(KEYS[1], e), e, now, kept}
end
local tokens = bucket_load(KEYS[1], now, tonumber(ARGV[2]), tonumber(ARGV[3]))
return {milli(tokens), 0, now, kept}
`)
