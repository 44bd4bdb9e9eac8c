-- layers.lua: the body of layersScript, after prelude.lua and layer_prelude.lua
-- (layerPrelude).
--
-- layersScript decides the shared bucket (optionally) and layers in one
-- atomic step: all grant and are charged, or none is. It mirrors
-- limiter.LayeredMemory.TakeLayersAt line by line.
--
-- KEYS: with the shared bucket, its state and override keys (with a shadow
-- of it, its shadow state and the override keys); then one key per layer.
-- ARGV: now_us (0: TIME), cost, horizon_us, shared (1; 0 without it; 2
-- without it but with a shadow of it, limiter.Options.Shadow),
-- shared rate, shared burst, n, extra (shared tokens to lease when all is
-- granted at once), rank, share1, share2, channel (the class on the shared
-- bucket, as in takeScript); then 10 values per layer: index (1-based,
-- named in the reply), kind (b: bucket, q: quota, m: budget, o: send
-- window), rate, quota or budget, burst (a budget: the request's price, a
-- quota in money), action (w: wait, d: dead_letter, y: delay; upper case W, D, Y for a
-- shadow layer, limiter.Layer.Shadow),
-- max_wait_us, and for a quota or budget four window boundaries b0..b3
-- around the caller's clock (0 for a bucket), for a send window its open
-- intervals as one string (backend.FormatSpans; "" always open) and three
-- zeros (a window keeps no state: its key is never read);
-- then the shared bucket's warm-up in µs (0 or absent: none), which ramps
-- the shared part as it ramps takeScript (warmup.lua); last, the paid
-- layers: for each layer, separated by spaces, the last instant in µs at
-- which the request passes it on a slot it already paid for
-- (limiter.PaidUntil), the slot's due and when it was booked (paidArg),
-- or 0; "" for none. Such a layer, at or before its
-- instant, waits 0 and is charged only the excess of a late slot
-- (limiter.PaidCharge). Then, for fair shares (fair.lua; absent or "":
-- none), the tenant's weight, the fair horizon in µs and the tenant's
-- field (RANK..TENANT), with two more KEYS after the layers': the tenant's
-- shard and the class totals and bins (the shared bucket only); without
-- them, three empty strings. Last, at 18 + 10n, each key's field
-- (key_fields: a keyed token bucket's in its shard, none for the others).
-- When a token-bucket layer with action delay has a key of its own (no
-- keys), KEYS ends with the bucket's since key (SINCE_KEY in
-- layer_prelude.lua), after the fair share's.
--
-- A concurrency layer (kind c) has its limit in place of the rate, its
-- lease in µs in place of the burst, and the request's holder in place of
-- b0 (slot_wait, slot_take): it waits until the earliest lease ends when
-- every slot is held; granted, the holder's lease ends at send plus the
-- lease. It never books a slot on refusal.
--
-- Reply: {status, wait_us, layer, remaining_milli, effective_rate_milli,
-- burst, now_us, tokens (cost plus the extra granted), rank, pushed_milli
-- (its push counter on the shared bucket), layers_due_us (granted: when
-- every layer had room, limiter.LayerResult.LayersDue), fair_active (with
-- fair shares: the tenants of the class counted)}. layer -1 is the fair
-- share (status 0: the tenant holds its share; come back after wait_us;
-- layers_due_us is then how far apart its reservations come due). status: 1 granted, 0
-- not
-- granted (come back after wait_us), 2 refused by layer's action, 4
-- refused by layer, a token bucket with action delay, which booked the
-- request's tokens for wait_us on itself alone (limiter.ReservesOnRefusal),
-- 3 refused by a lower rank's MinShare on the shared bucket (wait_us until
-- it would not), -1 cost above the shared burst, -2 cost above layer's burst or
-- quota or a price above a budget, -3 no window holds now (a clock skew
-- above a window) or a send window's intervals end before send. layer is
-- the 1-based index of the layer that set wait_us or refused, or 0 for the
-- shared bucket. A granted reply (status 1) goes on with three values per
-- shadow layer: its index, the µs until it had room (0 for a cost it can
-- never grant), and what it would have done (shadow_action: 0 granted and
-- charged, 1 wait, 2 dead_letter, 3 delay). A shadow layer never waits,
-- refuses or books; it is charged at send only when it would have granted.
-- A shadow shared bucket (shared 2) comes first, as index 0: a shadow
-- layer with action wait at the shared rate (the override's, if set; no
-- adaptive rate, warm-up, pause or class) and burst, whose state is a
-- layer bucket's in its own key (KEYS[1]); the real bucket is not read.

local now = now_us(ARGV[1])
local cost, horizon = tonumber(ARGV[2]), tonumber(ARGV[3])
local shared = ARGV[4] == '1'
local sshadow = ARGV[4] == '2'
local hrate, hburst, htok, hts, hw = 0, 0, 0, 0, 0 -- the shadow shared bucket
local n = tonumber(ARGV[7])
local extra = tonumber(ARGV[8])
local rank, s1, s2 = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local kb = 0
local srate, sburst, stokens, sts, safter, wait0, eff = 0, 0, 0, 0, 0, 0, 0
local pushed, visible, q1, need = 0, 0, 0, 0
local FAIR_N = 0
local fweight = tonumber(ARGV[15 + 10 * n])
local function reply(status, wait, layer, remaining, got, due)
  local p = 0
  if rank == 1 then p = P1 elseif rank == 2 then p = P2 end
  return {status, wait, layer, milli(remaining), milli(eff), sburst, now, got, rank, milli(p), due or 0, FAIR_N}
end
if shared then
  kb = 2
  srate, sburst = limits(KEYS[2], tonumber(ARGV[5]), tonumber(ARGV[6]))
  WARM = tonumber(ARGV[13 + 10 * n]) -- warmup.lua, as in takeScript
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
  if sshadow then
    kb = 2
    local _, b = limits(KEYS[2], tonumber(ARGV[5]), tonumber(ARGV[6]))
    hrate, hburst = CEIL, b -- the override's rate, before an adaptive one
    if cost <= hburst then htok, hts, hw = bucket_wait(KEYS[1], nil, now, cost, hrate, hburst) end
  end
end
-- Every layer is decided and charged at send, when the shared bucket's
-- reservation is due (send_charge).
local send = now + wait0

local idx, kind, rate, burst, action, maxw = {}, {}, {}, {}, {}, {}
local tok, lts, wend, used, w = {}, {}, {}, {}, {}
local sact, never = {}, {} -- a shadow layer's action; a cost it can never grant
local paid, pdue, pbooked = paid_flags(ARGV[14 + 10 * n], send)
local F = key_fields(ARGV[18 + 10 * n])
do -- the bucket's since key, last of KEYS when a layer has a key of its own
  local nk = kb + n
  if fweight then nk = nk + 2 end
  SINCE_KEY = KEYS[nk + 1]
end
for i = 1, n do
  local a = 12 + (i - 1) * 10
  local key, field = KEYS[kb + i], F[kb + i]
  idx[i], kind[i] = tonumber(ARGV[a + 1]), ARGV[a + 2]
  rate[i], burst[i] = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  action[i], maxw[i] = ARGV[a + 5], tonumber(ARGV[a + 6])
  sact[i] = SHADOW[action[i]]
  if sact[i] then action[i] = 'w' end -- never refuses
  local cap, c = burst[i], cost
  if kind[i] == 'q' then cap = rate[i] end
  if kind[i] == 'm' then cap, c = rate[i], burst[i] end -- a budget: its price
  if paid[i] then -- loaded here; a slot the state no longer holds does not count
    tok[i], lts[i] = bucket_load(key, field, now, rate[i], burst[i])
    if not paid_held(key, field, pdue[i], pbooked[i], now) then paid[i] = false end
  end
  if sact[i] and kind[i] ~= 'o' and c > cap then -- a window has no cap
    never[i], w[i] = true, 0
  elseif kind[i] == 'c' then
    w[i] = slot_wait(key, ARGV[a + 7], rate[i], now)
  elseif paid[i] then
    w[i] = 0
  elseif kind[i] == 'o' then
    local ww = window_wait(ARGV[a + 7], send, now)
    if not ww then return reply(-3, 0, idx[i], stokens, 0) end
    w[i] = ww
  elseif kind[i] == 'q' or kind[i] == 'm' then
    local quota, c = rate[i], cost
    if kind[i] == 'm' then c = burst[i] end -- a budget charges the price
    if c > quota then return reply(-2, 0, idx[i], stokens, 0) end
    local we = window_end(a + 7, send)
    if not we then return reply(-3, 0, idx[i], stokens, 0) end
    wend[i] = we
    used[i] = quota_used(key, we)
    w[i] = 0
    if used[i] + c > quota then w[i] = we - now end
  else
    if cost > burst[i] then return reply(-2, 0, idx[i], stokens, 0) end
    tok[i], lts[i], w[i] = bucket_wait(key, field, now, cost, rate[i], burst[i])
  end
end

local refused = refusal(n, action, w, maxw)
if refused > 0 then
  local r = refused
  return reply(refused_status(r, KEYS[kb + r], F[kb + r], kind[r], action[r], w[r], tok[r], lts[r], cost, now, rate[r], burst[r]), w[r], idx[r], stokens, 0)
end

-- A layer without room at send: come back when it has room, charging
-- nothing (a quota's room is its next window). Else a shared wait beyond
-- the horizon comes back when it fits.
local wait, limiting, due = wait0, 0, 0
for i = 1, n do
  if not sact[i] then
    if w[i] > wait then wait, limiting = w[i], idx[i] end
    if w[i] > due then due = w[i] end
  end
end
if limiting > 0 then return reply(0, wait, limiting, stokens, 0) end
-- Fair shares (fair.lua): a request that would queue books only while its
-- tenant holds less than its share of the horizon.
local ft, fk
if shared and fweight and fweight > 0 then
  fk = kb + n
  ft = fair_turn(KEYS[fk + 1], KEYS[fk + 2], ARGV[17 + 10 * n], now, rank, fweight)
  FAIR_N = ft.n
  if wait0 > 0 then
    local fcap = srate * tonumber(ARGV[16 + 10 * n]) / 1e6 * fweight / ft.w
    local fw = fair_wait(ft.h, fcap, cost, ft.last, now)
    if fw > 0 then return reply(0, fw, -1, stokens, 0, fair_spacing(ft.h, cost, ft.last, now)) end
  else
    ft = nil -- granted at once: it holds nothing in the queue
  end
end
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
  if ft then FAIR_N = fair_grant(ft, rank, cost, now, send) end
end
local out = reply(1, wait, limiting, safter, got, due)
if sshadow then
  local sa = shadow_action('w', cost > hburst, hw, 0, wait)
  out[#out + 1], out[#out + 2], out[#out + 3] = 0, hw, sa
  if sa == 0 then
    bucket_save(KEYS[1], nil, send_charge(htok, hts, send, cost, false, hrate, hburst), hts, now, hrate, hburst, send)
  end
end
for i = 1, n do
  local key, field = KEYS[kb + i], F[kb + i]
  local skip = false
  if sact[i] then
    local sa = shadow_action(sact[i], never[i], w[i], maxw[i], wait)
    out[#out + 1], out[#out + 2], out[#out + 3] = idx[i], w[i], sa
    skip = sa ~= 0 -- charged only when it would have granted
  end
  if skip then
  elseif kind[i] == 'c' then
    slot_take(key, ARGV[12 + (i - 1) * 10 + 7], send + burst[i], now)
  elseif kind[i] == 'q' then
    quota_save(key, wend[i], used[i] + cost, now)
  elseif kind[i] == 'm' then
    if burst[i] > 0 then quota_save(key, wend[i], used[i] + burst[i], now) end
  elseif kind[i] == 'o' then
    -- a window charges nothing
  else
    local after = send_charge(tok[i], lts[i], send, cost, paid[i], rate[i], burst[i])
    bucket_save(key, field, after, lts[i], now, rate[i], burst[i], send)
  end
end
return out
