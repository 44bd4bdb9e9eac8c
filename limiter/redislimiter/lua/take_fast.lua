-- take_fast.lua: the start of takeScript (take_fast.lua, prelude.lua,
-- take.lua): it reads the state hash once, for itself and for the full take,
-- and decides the plain takes without the prelude. A take on a bucket with no
-- override hash, no warm-up configured, no class fields in its state (no
-- reservation of a class to jump) and no pause, whose cost is within the burst,
-- and no hold (ARGV[12], a lease's: the full take charges it), is decided
-- here exactly as the full take below would decide it: granted at
-- once (any class), or, for the normal class, reserved or refused by the
-- horizon. The script then returns before the prelude runs; anything else goes
-- on to the full take, which uses TAKE_NOW as its time, TAKE_ST as the state
-- read (load()) and TAKE_NOOV to skip reading a missing override (limits()).
-- The full take's Redis time is mostly the prelude's closures (every call of a
-- script creates each of its functions), hash fields read into Lua, numbers
-- Redis formats with %.17g and PEXPIRE; eight replicas' calls queue behind each
-- other on Redis's one thread, so it shows in every caller's latency.
-- TestTakeFastPathSameAsFull runs both on random states.
--
-- Its reply is "granted tokens wait_us remaining_milli now_us pushed_milli"
-- (granted 1 or 0): at the configured rate and burst, of the asking class
-- (fastTakeResult). The commonest take of a bucket far above its demand (a
-- normal take with only the first five arguments, on a missing state and
-- override, full again within a microsecond) replies with now_us alone, an
-- integer (fullAgainResult): it cost Redis's one thread, which every replica's
-- calls queue behind, 2.9–3.1 µs a call against 3.7–4.1 µs with the string
-- (redis-benchmark -P 50, BENCHMARKS.md).

local TAKE_NOW, TAKE_REAL = nil, nil
if ARGV[6] then TAKE_NOW = tonumber(ARGV[6]) end
if not (TAKE_NOW and TAKE_NOW > 0) then
  local t = redis.call('TIME')
  TAKE_NOW = tonumber(t[1]) * 1000000 + tonumber(t[2])
  TAKE_REAL = math.floor(TAKE_NOW / 1000)
end
-- The state's fields in load()'s order: tokens ts wts x q0 q2 p1 p2 j1 j2.
local TAKE_ST, TAKE_NOOV = {}, false
do
  -- plain: no field but tokens ts wts x by wu, and the push counters p1
  -- p2, which a take of rank 1 or 2 that pushes nobody only reports; a
  -- low queue (q2) only for a take of rank 2, the queue's end.
  -- One EXISTS of both keys: none (a full bucket, no override) is the
  -- plentiful bucket's usual answer when its takes write nothing (below).
  local n = redis.call('EXISTS', KEYS[1], KEYS[2])
{{take_full_again.lua}}
  local h, st, plain, rank = nil, TAKE_ST, true, 1
  if n > 0 then h = redis.call('HGETALL', KEYS[1]) else h = {} end
  TAKE_NOOV = n == 0 or (n == 1 and #h > 0)
  if ARGV[8] then rank = tonumber(ARGV[8]) or 1 end
  if ARGV[12] and ARGV[12] ~= '0' then plain = false end -- a hold: the full take
  for i = 1, #h, 2 do
    local f = h[i]
    if f == 'tokens' then st[1] = h[i + 1]
    elseif f == 'ts' then st[2] = h[i + 1]
    elseif f == 'x' then st[4] = h[i + 1]
    elseif f == 'wts' then st[3] = h[i + 1]
    elseif f == 'p1' then st[7] = h[i + 1]
    elseif f == 'p2' then st[8] = h[i + 1]
    elseif f == 'q2' then
      st[6] = h[i + 1]
      if rank ~= 2 then plain = false end
    elseif f ~= 'by' and f ~= 'wu' then
      plain = false
      if f == 'q0' then st[5] = h[i + 1]
      elseif f == 'j1' then st[9] = h[i + 1]
      elseif f == 'j2' then st[10] = h[i + 1] end
    end
  end
  local now, rate, burst, cost = TAKE_NOW, tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
  local warm = nil
  if ARGV[7] then warm = tonumber(ARGV[7]) end
  if plain and TAKE_NOOV and not (warm and warm > 0) and cost <= burst then
    local tokens, ts = tonumber(st[1]), tonumber(st[2])
    if not tokens or not ts then
      tokens, ts = burst, now
    else
      if now > ts then
        tokens = tokens + (now - ts) * rate / 1e6
        ts = now
      end
      if tokens > burst then tokens = burst end
    end
    -- The low queue, repaid by the refill as prio_refilled does with no
    -- rank-0 queue; the push counter the reply reports.
    local rq2, p = tonumber(st[6]), 0
    local q2 = rq2 or 0
    if q2 > 0 then q2 = math.min(q2, math.max(0, -tokens)) end
    if rank == 1 then p = tonumber(st[7]) or 0 elseif rank == 2 then p = tonumber(st[8]) or 0 end
    p = math.floor(p * 1000 + 0.5)
    if p > 1e15 then p = 1e15 elseif p < -1e15 then p = -1e15 end
    local left, got, wait = tokens - cost, cost, 0
    if ts <= now and (left >= 0 or rank >= 1) then
      if left >= 0 then
        local extra = 0
        if ARGV[4] ~= '0' then extra = tonumber(ARGV[4]) end
        if extra > 0 and left >= 1 then
          local k = math.min(extra, math.floor(left))
          left = left - k
          got = got + k
        end
      else -- rank 1 or 2 reserves at the end of its queue, pushing nobody
        wait = math.ceil(-left * 1e6 / rate)
        if wait > 1e15 then wait = 1e15 end
        local max_wait, horizon = tonumber(ARGV[5]), 0
        if max_wait > 0 then
          horizon = math.ceil(cost * 1e6 / rate)
          if horizon > 1e15 then horizon = 1e15 end
          horizon = math.max(max_wait, horizon)
        end
        if wait > horizon then
          local m = math.floor(tokens * 1000 + 0.5)
          if m > 1e15 then m = 1e15 elseif m < -1e15 then m = -1e15 end
          return string.format('0 0 %d %d %d %d', wait - horizon, m, now, p)
        end
        if rank == 2 then q2 = q2 + (cost - math.max(0, tokens)) end
      end
      if q2 > 0 then q2 = math.min(q2, math.max(0, -left)) end
      if TAKE_REAL and (burst - left) * 1e6 <= rate and q2 == (rq2 or 0) then
        -- Full again within a microsecond, before any other script can
        -- run on the key (TIME ticks between two; its TIME is Redis's):
        -- the next take finds it full from the state stored or from none,
        -- as after the key's expiry, so nothing is written.
        return string.format('1 %d 0 %d %d %d', got, math.floor(left * 1000 + 0.5), now, p)
      end
      -- save(): the strings Redis would store for these numbers (%.17g),
      -- made with %d when whole, which is cheaper; PEXPIRE only when the
      -- recorded expiry comes less than 100 ms after full.
      local a
      if left == math.floor(left) and left > -1e15 and left < 1e15 then a = string.format('%d', left) else a = string.format('%.17g', left) end
      a = {'tokens', a, 'ts', string.format('%d', ts)}
      if q2 ~= (rq2 or 0) then
        a[5] = 'q2'
        if q2 == math.floor(q2) and q2 < 1e15 then a[6] = string.format('%d', q2) else a[6] = string.format('%.17g', q2) end
      end
      local full, rms = math.ceil(((ts - now) + (burst - left) * 1e6 / rate) / 1000), TAKE_REAL
      if not rms then
        local t = redis.call('TIME')
        rms = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
      end
      local x = tonumber(st[4])
      if x and x >= rms + full + 100 then
        redis.call('HSET', KEYS[1], unpack(a))
      else
        local keep = full + 1000
        if left < 0 then keep = keep + math.floor(-left * 250 / rate) end
        a[#a + 1] = 'x'
        a[#a + 1] = string.format('%d', rms + keep - 1)
        redis.call('HSET', KEYS[1], unpack(a))
        redis.call('PEXPIRE', KEYS[1], string.format('%d', keep))
      end
      local m = math.floor(left * 1000 + 0.5)
      if m > 1e15 then m = 1e15 elseif m < -1e15 then m = -1e15 end
      return string.format('1 %d %d %d %d %d', got, wait, m, now, p)
    end
  end
end
