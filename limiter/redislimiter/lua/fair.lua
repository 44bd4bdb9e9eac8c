-- fair.lua: the functions of fair shares among tenants (limiter.Fair), in
-- layersScript between layer_prelude.lua and layers.lua. They mirror
-- internal/backend/fair.go line by line, so that both stores pass the same
-- step tables.
--
-- Keys of bucket NAME (all in its {NAME} slot; docs/design.md, "Redis
-- keys"):
--   PREFIX{NAME}:fairt:S  hash, S the tenant's shard (0..255, FNV-1a of the
--     tenant, computed by the caller): field RANK..TENANT "held last span":
--     the tenant held held tokens reserved and not yet due at last - span
--     (µs), its reservations due evenly until last (µs); field "~" when
--     the shard is next swept of the tenants whose last has passed. Small
--     shards stay listpacks: an active tenant costs its field and value.
--   PREFIX{NAME}:fairw  hash: wRANK, nRANK (the weights and the number of
--     the tenants of class RANK counted), d (the last 10 ms bin drained,
--     END / FAIRGRAIN), and per bin, field IDX*4+RANK, "weight count" of the
--     tenants whose last reservation is due in the bin ending at
--     IDX*FAIRGRAIN (µs).
-- Each hash expires a second after the last reservation it tracks.

local FAIR_GRAIN = {{FAIRGRAIN}}
-- Bins drained one by one; after a longer gap the whole hash is read.
local FAIR_CATCHUP = 1000

local function fair_bin_end(d)
  return math.floor((d + FAIR_GRAIN - 1) / FAIR_GRAIN) * FAIR_GRAIN
end

local function fair_bin(e, rank)
  return string.format('%d', e / FAIR_GRAIN * 4 + rank)
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

-- fair_drain forgets the bins that ended at or before now, in their order,
-- and returns whether agg has its cursor.
local function fair_drain(agg, now)
  local cur = math.floor(now / FAIR_GRAIN)
  local d = tonumber(redis.call('HGET', agg, 'd'))
  if not d then return false end
  if d >= cur then return true end
  local dw, dn, del = {0, 0, 0}, {0, 0, 0}, {}
  local function take(f, v, r)
    local bw, bn = num2(v)
    if bw then
      dw[r + 1], dn[r + 1] = dw[r + 1] + bw, dn[r + 1] + bn
      del[#del + 1] = f
    end
  end
  if cur - d > FAIR_CATCHUP then
    local all = redis.call('HGETALL', agg)
    for i = 1, #all, 2 do
      local f = tonumber(all[i])
      if f and math.floor(f / 4) <= cur then take(all[i], all[i + 1], f % 4) end
    end
  else
    for b = d + 1, cur do
      local f0, f1, f2 = fair_bin(b * FAIR_GRAIN, 0), fair_bin(b * FAIR_GRAIN, 1), fair_bin(b * FAIR_GRAIN, 2)
      local v = redis.call('HMGET', agg, f0, f1, f2)
      take(f0, v[1], 0)
      take(f1, v[2], 1)
      take(f2, v[3], 2)
    end
  end
  redis.call('HSET', agg, 'd', cur)
  if #del == 0 then return true end
  redis.call('HDEL', agg, unpack(del))
  for r = 0, 2 do
    if dn[r + 1] > 0 then
      local c = redis.call('HMGET', agg, 'w' .. r, 'n' .. r)
      local w = (tonumber(c[1]) or 0) - dw[r + 1]
      local n = (tonumber(c[2]) or 0) - dn[r + 1]
      if n <= 0 then w, n = 0, 0 end
      redis.call('HSET', agg, 'w' .. r, string.format('%.17g', w), 'n' .. r, n)
    end
  end
  return true
end

-- fair_sweep deletes from shard the tenants whose last reservation's bin
-- has passed, and returns when to sweep next: the earliest bin end of
-- those left, at least a second away (nil: none left).
local function fair_sweep(shard, now)
  local all = redis.call('HGETALL', shard)
  local del, nx = {}, nil
  for i = 1, #all, 2 do
    if all[i] ~= '~' then
      local e = fair_bin_end(tonumber(string.match(all[i + 1], '^%S+ (%S+)')) or 0)
      if e <= now then
        del[#del + 1] = all[i]
      elseif not nx or e < nx then
        nx = e
      end
    end
  end
  if #del > 0 then redis.call('HDEL', shard, unpack(del)) end
  if not nx then
    redis.call('HDEL', shard, '~')
    return nil
  end
  if nx < now + 1e6 then nx = now + 1e6 end
  redis.call('HSET', shard, '~', string.format('%d', nx))
  return nx
end

-- fair_turn reads the tenant (field field of shard, class rank, weight) at
-- now.
local function fair_turn(shard, agg, field, now, rank, weight)
  local t = {shard = shard, agg = agg, field = field, weight = weight, held = 0, ts = 0, last = 0}
  t.cursor = fair_drain(agg, now)
  local v = redis.call('HMGET', shard, field, '~')
  t.nx = tonumber(v[2])
  if t.nx and t.nx <= now then t.nx = fair_sweep(shard, now) end
  if v[1] then
    local a, b, c = string.match(v[1], '^(%S+) (%S+) (%S+)$')
    t.held, t.last = tonumber(a) or 0, tonumber(b) or 0
    t.ts = t.last - (tonumber(c) or 0)
  end
  t.h = fair_held(t.held, t.ts, t.last, now)
  t.counted = t.last > 0 and fair_bin_end(t.last) > now
  local cur = redis.call('HMGET', agg, 'w' .. rank, 'n' .. rank)
  t.w, t.n = tonumber(cur[1]) or 0, tonumber(cur[2]) or 0
  if not t.counted then t.w = t.w + weight end
  return t
end

local function fair_bin_add(agg, rank, e, weight)
  local m = fair_bin(e, rank)
  local bw, bn = num2(redis.call('HGET', agg, m))
  redis.call('HSET', agg, m, string.format('%.17g %d', (bw or 0) + weight, (bn or 0) + 1))
end

local function fair_expire(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

-- fair_grant books cost for the tenant of t (fair_turn), its reservation
-- due at send, and returns the tenants of its class counted.
local function fair_grant(t, rank, cost, now, send)
  local agg = t.agg
  local last = t.last
  if send > last then last = send end
  local nb = fair_bin_end(last)
  local n = t.n
  if t.counted then
    local ob = fair_bin_end(t.last)
    if ob ~= nb then
      local m = fair_bin(ob, rank)
      local bw, bn = num2(redis.call('HGET', agg, m))
      if bw then
        bw, bn = bw - t.weight, bn - 1
        if bn <= 0 then
          redis.call('HDEL', agg, m)
        else
          redis.call('HSET', agg, m, string.format('%.17g %d', bw, bn))
        end
      end
      fair_bin_add(agg, rank, nb, t.weight)
    end
  else
    n = n + 1
    redis.call('HSET', agg, 'w' .. rank, string.format('%.17g', t.w), 'n' .. rank, n)
    fair_bin_add(agg, rank, nb, t.weight)
  end
  if not t.cursor then redis.call('HSET', agg, 'd', math.floor(now / FAIR_GRAIN)) end
  local ms = math.ceil((last - now) / 1000) + 1000
  local nx = nb
  if nx < now + 1e6 then nx = now + 1e6 end
  if t.nx and t.nx <= nx then
    redis.call('HSET', t.shard, t.field, string.format('%.17g %d %d', t.h + cost, last, last - now))
  else
    redis.call('HSET', t.shard, t.field, string.format('%.17g %d %d', t.h + cost, last, last - now), '~', string.format('%d', nx))
  end
  fair_expire(t.shard, ms)
  fair_expire(agg, ms)
  return n
end
