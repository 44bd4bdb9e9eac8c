-- fair.lua: the functions of fair shares among tenants (limiter.Fair), in
-- layersScript between layer_prelude.lua and layers.lua. They mirror
-- internal/backend/fair.go line by line, so that both stores pass the same
-- step tables.
--
-- Keys of bucket NAME (all in its {NAME} slot):
--   PREFIX{NAME}:fair:RANK:TENANT  string "held ts last": the tokens the
--     tenant held reserved and not yet due at ts (µs), its reservations
--     due evenly until last (µs); expires a second after last.
--   PREFIX{NAME}:fair  hash: wRANK, nRANK (the weights and the number of
--     the tenants of class RANK counted), and per bin "RANK:END" the
--     "weight count" of the tenants whose last reservation is due in the
--     bin ending at END (µs, a multiple of FAIRGRAIN).
--   PREFIX{NAME}:fairbins  sorted set: "RANK:END" by END, the bins to
--     forget once END has passed.
-- The hash and the set expire a second after the last reservation of any
-- tenant.

local FAIR_GRAIN = {{FAIRGRAIN}}

local function fair_bin_end(d)
  return math.floor((d + FAIR_GRAIN - 1) / FAIR_GRAIN) * FAIR_GRAIN
end

local function fair_held(held, ts, last, now)
  if held <= 0 or last <= now then return 0 end
  if now <= ts or last <= ts then return held end
  return held * (last - now) / (last - ts)
end

local function fair_wait(h, cap, cost, last, now)
  if h <= 0 or h + cost <= cap then return 0 end
  local span = last - now
  local x = span
  local room = cap - cost
  if room > 0 then x = span * (1 - room / h) end
  local r = math.ceil(x)
  if r < 1 then r = 1 end
  return r
end

local function fair_spacing(h, cost, last, now)
  if h <= 0 or last <= now then return 0 end
  return math.ceil(cost * (last - now) / h)
end

-- fair_drain forgets the bins that ended at or before now, in their order.
local function fair_drain(agg, bins, now)
  local due = redis.call('ZRANGEBYSCORE', bins, '-inf', now)
  if #due == 0 then return end
  for _, m in ipairs(due) do
    local bw, bn = num2(redis.call('HGET', agg, m))
    if bw then
      local r = string.sub(m, 1, 1)
      local cur = redis.call('HMGET', agg, 'w' .. r, 'n' .. r)
      local w = (tonumber(cur[1]) or 0) - bw
      local n = (tonumber(cur[2]) or 0) - bn
      if n <= 0 then w, n = 0, 0 end
      redis.call('HSET', agg, 'w' .. r, string.format('%.17g', w), 'n' .. r, n)
      redis.call('HDEL', agg, m)
    end
  end
  redis.call('ZREMRANGEBYSCORE', bins, '-inf', now)
end

-- fair_turn reads the tenant (key tkey, class rank, weight) at now.
local function fair_turn(tkey, agg, bins, now, rank, weight)
  fair_drain(agg, bins, now)
  local t = {weight = weight, held = 0, ts = 0, last = 0}
  local v = redis.call('GET', tkey)
  if v then
    local a, b, c = string.match(v, '^(%S+) (%S+) (%S+)$')
    t.held, t.ts, t.last = tonumber(a) or 0, tonumber(b) or 0, tonumber(c) or 0
  end
  t.h = fair_held(t.held, t.ts, t.last, now)
  t.counted = t.last > 0 and fair_bin_end(t.last) > now
  local cur = redis.call('HMGET', agg, 'w' .. rank, 'n' .. rank)
  t.w, t.n = tonumber(cur[1]) or 0, tonumber(cur[2]) or 0
  if not t.counted then t.w = t.w + weight end
  return t
end

local function fair_bin_add(agg, bins, rank, e, weight)
  local m = rank .. ':' .. string.format('%d', e)
  local bw, bn = num2(redis.call('HGET', agg, m))
  redis.call('HSET', agg, m, string.format('%.17g %d', (bw or 0) + weight, (bn or 0) + 1))
  redis.call('ZADD', bins, e, m)
end

local function fair_expire(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

-- fair_grant books cost for the tenant of t, its reservation due at send,
-- and returns the tenants of its class counted.
local function fair_grant(t, tkey, agg, bins, rank, cost, now, send)
  local last = t.last
  if send > last then last = send end
  local nb = fair_bin_end(last)
  local n = t.n
  if t.counted then
    local ob = fair_bin_end(t.last)
    if ob ~= nb then
      local m = rank .. ':' .. string.format('%d', ob)
      local bw, bn = num2(redis.call('HGET', agg, m))
      if bw then
        bw, bn = bw - t.weight, bn - 1
        if bn <= 0 then
          redis.call('HDEL', agg, m)
          redis.call('ZREM', bins, m)
        else
          redis.call('HSET', agg, m, string.format('%.17g %d', bw, bn))
        end
      end
      fair_bin_add(agg, bins, rank, nb, t.weight)
    end
  else
    n = n + 1
    redis.call('HSET', agg, 'w' .. rank, string.format('%.17g', t.w), 'n' .. rank, n)
    fair_bin_add(agg, bins, rank, nb, t.weight)
  end
  local ms = math.ceil((last - now) / 1000) + 1000
  redis.call('SET', tkey, string.format('%.17g %d %d', t.h + cost, now, last), 'PX', ms)
  fair_expire(agg, ms)
  fair_expire(bins, ms)
  return n
end
