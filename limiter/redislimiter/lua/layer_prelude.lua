-- layer_prelude.lua: the functions of the layer scripts. A layer's state is
-- one string key (a keyed token bucket's, a field of a hash; see
-- key_fields): for a layer bucket, tokens, ts (µs) and last (the latest
-- instant in µs a message was charged to go out at, or 0) as three
-- little-endian doubles (24 bytes, struct '<ddd': exact, so that a token
-- count survives a round trip as it does in the in-process store, and
-- what Redis allocates for the value is 48 bytes where the decimal text
-- took 64 to 80); "window_end used" for a quota (%.17g and %d).
--
-- layerPrelude is prelude.lua followed by this file; layers_keyed.lua
-- follows math.lua and this file, without the rest of the prelude.

local function num2(v)
  if not v then return nil, nil end
  local a, b = string.match(v, '^(%S+) (%S+)$')
  return tonumber(a), tonumber(b)
end

-- A keyed token bucket's state is not a key of its own but a field of a
-- hash, its shard (2^layerShardBits per layer, see Layered.bucketLoc): field
-- the rest of the key's hash, value the 24 bytes above. Small hashes stay
-- listpacks, where a bucket costs its field and value and little more. A
-- bucket full again is the same as a missing one, so a shard expires with
-- the last of its buckets to fill up (field "~": see SHARD_EXP), and a
-- bucket that fills up before the rest of its shard is deleted by a later
-- sweep (shard_sweep). Field "^" holds when the shard was made (see
-- CREATED).
--
-- key_fields returns, from a string of one entry per KEYS entry in order
-- (its length in one byte, then its bytes: the field of a bucket in a
-- shard, or nothing for a key of its own), the fields by KEYS index.
local function key_fields(s)
  local F = {}
  if not s then return F end
  local p, k = 1, 0
  while p <= #s do
    k = k + 1
    local l = string.byte(s, p)
    if l > 0 then F[k] = string.sub(s, p + 1, p + l) end
    p = p + 1 + l
  end
  return F
end

-- LAST holds, by key and field, the last send instant of each layer bucket
-- that bucket_load read (0 when none): bucket_save keeps it unless told a
-- later one.
local LAST = {}

-- SHARD_EXP holds, by shard, when its TTL ends as last set (ms on the
-- scripts' clock, field "~" of the shard; 0 for a new shard), read with
-- the bucket (bucket_get): a bucket saved that is full again before it
-- costs no more than its HSET.
local SHARD_EXP = {}

-- CREATED holds, by shard, when it was made, in µs (field "^", in ms on
-- the scripts' clock: a slot booked in the millisecond that Redis lost
-- the shard in, before the loss, would pass; 0 for a shard an older
-- version made), read only by a paid slot's check (key_created,
-- paid_held; most requests carry none): every bucket in it is as old at
-- most.
local CREATED = {}

-- SINCE_KEY is, when a script that reads layer buckets of their own keys
-- sets it (layers.lua), the bucket's key holding when those keys were
-- first written after the store held none of them (µs), as "^" is for a
-- shard: see key_created.
local SINCE_KEY = nil

-- bucket_get returns the value of a layer bucket: key's own (field nil) or
-- field's of the shard key.
local function bucket_get(key, field)
  if not field then return redis.call('GET', key) end
  local v = redis.call('HMGET', key, field, '~')
  SHARD_EXP[key] = tonumber(v[2]) or 0
  return v[1]
end

-- key_created returns when the state of a layer bucket (loaded by
-- bucket_load) was made at the earliest, µs: its shard's "^"; for a key
-- of its own, SINCE_KEY's instant, which a missing SINCE_KEY sets to now
-- (the store lost it, or it was never written: the slots booked before
-- are not held); 0 without SINCE_KEY.
local function key_created(key, field, now)
  if field then
    if not CREATED[key] then CREATED[key] = (tonumber(redis.call('HGET', key, '^')) or 0) * 1000 end
    return CREATED[key]
  end
  if not SINCE_KEY then return 0 end
  local v = tonumber(redis.call('GET', SINCE_KEY))
  if v then return v end
  redis.call('SET', SINCE_KEY, string.format('%d', now))
  return now
end

-- bucket_load returns a layer bucket's tokens and timestamp at now. A
-- missing key or field is a full bucket, and so is a value of another
-- format.
local function bucket_load(key, field, now, rate, burst)
  local v = bucket_get(key, field)
  local tokens, ts, last = nil, nil, 0
  if v and #v == 24 then
    tokens, ts, last = struct.unpack('<ddd', v)
    -- A value of another format (the decimal text of an unkeyed layer
    -- written before) decodes to a ts far below 1e12: a full bucket.
    if not (ts >= 1e12) then tokens, ts, last = nil, nil, 0 end
  end
  LAST[key .. (field or '')] = last
  if not tokens or not ts then return burst, now end
  if now > ts then
    tokens = tokens + (now - ts) * rate / 1e6
    ts = now
  end
  if tokens > burst then tokens = burst end
  return tokens, ts
end

-- bucket_full_us returns the µs from now at which a bucket holding tokens
-- at ts is full again, plus the second a bucket is kept beyond it.
local function bucket_full_us(tokens, ts, now, rate, burst)
  return (ts - now) + (burst - tokens) * 1e6 / rate + 1e6
end

-- SWEEP_SHARE: a bucket added to a shard of n fields sweeps it with a
-- chance of SWEEP_SHARE/n (every time below 2*SWEEP_SHARE), so that a sweep, which reads
-- the whole shard, costs a few fields read per bucket added, and the
-- buckets full again that a shard still holds are about n/SWEEP_SHARE.
local SWEEP_SHARE = 8

-- shard_sweep deletes from shard key the buckets (of rate and burst) full
-- again at now, but field, with a chance of SWEEP_SHARE in the shard's
-- fields, drawn from field (a fresh bucket's, the rest of a hash) and now.
local function shard_sweep(key, field, now, rate, burst)
  local k = math.floor(redis.call('HLEN', key) / SWEEP_SHARE)
  if k > 1 then
    local a, b = string.byte(field, 1, 2)
    if (a * 256 + b + now) % k ~= 0 then return end
  end
  local all = redis.call('HGETALL', key)
  local del = {}
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    if f ~= field and f ~= '~' and f ~= '^' then
      local full = -1
      if #v == 24 then
        local tokens, ts = struct.unpack('<dd', v)
        if ts >= 1e12 then full = bucket_full_us(tokens, ts, now, rate, burst) end
      end
      if full <= 0 then del[#del + 1] = f end
    end
  end
  if #del > 0 then redis.call('HDEL', key, unpack(del)) end
end

-- bucket_save stores a layer bucket that expires when it is full again,
-- with its last send instant: send when later than the one it had. A
-- bucket in a shard keeps the shard until it is full again: when it is
-- full later than the shard's TTL, the TTL moves to then and an eighth of
-- the bucket's time to full again later (at least a second), so that the
-- next buckets saved seldom move it again. A bucket new to its shard may
-- sweep it (shard_sweep).
local function bucket_save(key, field, tokens, ts, now, rate, burst, send)
  local ms = math.ceil(bucket_full_us(tokens, ts, now, rate, burst) / 1000)
  local last = LAST[key .. (field or '')] or 0
  if send and send > last then last = send end
  local v = struct.pack('<ddd', tokens, ts, last)
  if not field then
    redis.call('SET', key, v, 'PX', ms)
    return
  end
  local now_ms = math.floor(now / 1000)
  local cur = SHARD_EXP[key] or 0
  local added
  if now_ms + ms > cur then
    local keep = ms + math.max(1000, math.ceil(ms / 8))
    SHARD_EXP[key] = now_ms + keep
    if cur == 0 then -- a new shard: nothing else in it to sweep
      CREATED[key] = now_ms * 1000
      redis.call('HSET', key, field, v, '~', string.format('%d', now_ms + keep), '^', string.format('%d', now_ms))
      redis.call('PEXPIRE', key, keep)
      return
    end
    added = redis.call('HSET', key, field, v, '~', string.format('%d', now_ms + keep))
    redis.call('PEXPIRE', key, keep)
  else
    added = redis.call('HSET', key, field, v)
  end
  if added == 1 then shard_sweep(key, field, now, rate, burst) end
end

-- bucket_wait returns a layer bucket's tokens and timestamp at now, and
-- the µs until it holds cost tokens (0 when it holds them now).
local function bucket_wait(key, field, now, cost, rate, burst)
  local tokens, ts = bucket_load(key, field, now, rate, burst)
  local wt = ts - now
  local after = tokens - cost
  if after < 0 then wt = clamp(wt + wait_us(-after, rate)) end
  if wt < 0 then wt = 0 end
  return tokens, ts, wt
end

-- paid_flags returns, from a string of one "until:due:booked" triple of
-- instants in µs (or 0) per layer separated by spaces (see paidArg),
-- which layers the request passes on a slot it already paid for at now:
-- those whose until is not 0 nor before now; and, by layer, the slot's
-- due and when it was booked (0: unknown). Such a layer waits 0 and is
-- charged paid_charge, once paid_held found its state still holding the
-- slot. A request without paid slots ("", most of them) gets the shared
-- empty tables.
local NO_PAID = {}
local function paid_flags(s, now)
  if not s or s == '' then return NO_PAID, NO_PAID, NO_PAID end
  local p, due, booked, i = {}, {}, {}, 0
  for f in string.gmatch(s, '[^ ]+') do
    i = i + 1
    local u, d, b = string.match(f, '^(%d+):?(%d*):?(%d*)$')
    u = tonumber(u) or 0
    p[i] = u > 0 and now <= u
    due[i] = tonumber(d) or 0
    booked[i] = tonumber(b) or 0
  end
  return p, due, booked
end

-- paid_held reports whether the state of a layer bucket (loaded by
-- bucket_load) still holds a slot due at due, booked at booked
-- (backend.PaidHeld): its last send instant at or after due, less a
-- millisecond, and the state made at or before booked (key_created). A
-- slot booked in a state Redis has lost since (a restart without
-- persistence) is not: the message is decided as any other, or the key
-- would get its fresh burst and the old slot both, even once the fresh
-- state has booked past the slot's due.
local function paid_held(key, field, due, booked, now)
  if (LAST[key .. (field or '')] or 0) < due - 1000 then return false end
  return key_created(key, field, now) <= booked
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
local function refused_status(i, key, field, kind, action, w, tok, lts, cost, now, rate, burst)
  if action == 'y' and kind == 'b' and w < 1e15 then
    bucket_save(key, field, tok - cost, lts, now, rate, burst, now + w)
    if not field and SINCE_KEY then redis.call('SET', SINCE_KEY, string.format('%d', now), 'NX') end
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

-- SHADOW maps the action of a shadow layer (upper case, see layersScript)
-- to its own.
local SHADOW = {W = 'w', D = 'd', Y = 'y'}

-- shadow_action returns what a shadow layer whose action is act would have
-- done with a request granted to go out wait µs from now, the layer having
-- room in w µs (limiter's shadowAction): 0 granted, 1 wait, 2 dead_letter,
-- 3 delay (its action, w being above its max wait maxw); 2 for a cost it
-- can never grant (never).
local function shadow_action(act, never, w, maxw, wait)
  if never then return 2 end
  if act ~= 'w' and w > maxw then
    if act == 'd' then return 2 end
    return 3
  end
  if w > wait then return 1 end
  return 0
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

-- A concurrency layer's key (kind c) is a sorted set: one member per
-- holder of a slot, scored by the end of its lease in µs. The key expires
-- with its last lease. Ended leases are dropped only when they could
-- matter, when the set holds the limit: below it the slot is free however
-- many of its members ended, and the set never grows past the limit.

-- SLOT_NEW holds, by key, whether slot_wait found the key absent (no
-- member, so no TTL): slot_take then sets its TTL without reading it.
local SLOT_NEW = {}

-- slot_wait returns the µs a request of holder waits at now for a slot of
-- key, of which limit may be held: 0 when one is free or holder holds one
-- already, else until the earliest lease ends. It drops the ended leases
-- when every slot looks held (backend.LayeredMemory's slotWait).
local function slot_wait(key, holder, limit, now)
  local held = redis.call('ZCARD', key)
  SLOT_NEW[key] = held == 0
  if held < limit then return 0 end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if redis.call('ZCARD', key) < limit then return 0 end
  if redis.call('ZSCORE', key, holder) then return 0 end
  local e = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local w = tonumber(e[2]) - now
  if w < 0 then w = 0 end
  return w
end

-- slot_take gives holder a slot of key whose lease ends at ends (µs), and
-- keeps the key until a second after its last lease ends. slot_wait read
-- the key just before: a key it found absent has no TTL to compare with.
local function slot_take(key, holder, ends, now)
  local ms = math.ceil((ends - now) / 1000) + 1000
  if SLOT_NEW[key] then
    SLOT_NEW[key] = false
    redis.call('ZADD', key, ends, holder)
    redis.call('PEXPIRE', key, ms)
    return
  end
  local ttl = redis.call('PTTL', key)
  redis.call('ZADD', key, ends, holder)
  if ttl < ms then redis.call('PEXPIRE', key, ms) end
end

-- window_wait returns how long after now a send window is open at send or
-- after it (backend.WindowWait): 0 when send is inside one of its open
-- intervals s ("start end start end ..." in µs; "" for always open), else
-- the next start less now; nil when send is past them all (a clock skew).
local function window_wait(s, send, now)
  if s == '' then return 0 end
  local st = nil
  for v in string.gmatch(s, '%d+') do
    local x = tonumber(v)
    if not st then
      st = x
    else
      if send < st then return st - now end
      if send < x then return 0 end
      st = nil
    end
  end
  return nil
end
