package redislimiter

// priorityLua is the part of the scripts' prelude for priority classes
// (see the priority state in package limiter's priority.go, whose prio
// has the same arithmetic in the same order). The state hash holds, beside
// tokens and ts, the fields q1 q2 (tokens reserved by ranks 1 and 2), p1 p2
// (their push counters) and j1 j2 (the jump allowances over them, in
// refilled tokens); a missing field is 0, a missing j a whole burst (nil).
// load() reads them in its HMGET (prio_read) and applies the refill
// (prio_refilled); save() writes, in its HSET, only those that changed, so
// a take without classes costs two more fields read. It needs milli.
const priorityLua = `
local Q1, Q2, P1, P2, J1, J2 = 0, 0, 0, 0, nil, nil
local RQ1, RQ2, RP1, RP2, RJ1, RJ2 = nil, nil, nil, nil, nil, nil

-- prio_read takes the fields from an HMGET reply whose q1 is at index o.
local function prio_read(st, o)
  RQ1, RQ2, RP1, RP2 = tonumber(st[o]), tonumber(st[o + 1]), tonumber(st[o + 2]), tonumber(st[o + 3])
  RJ1, RJ2 = tonumber(st[o + 4]), tonumber(st[o + 5])
  Q1, Q2, P1, P2, J1, J2 = RQ1 or 0, RQ2 or 0, RP1 or 0, RP2 or 0, RJ1, RJ2
end

-- prio_norm repays the front of the queue: the ranks' reservations never
-- exceed the tokens reserved, max(0, -t).
local function prio_norm(t)
  if Q1 > 0 or Q2 > 0 then
    local total = math.max(0, -t)
    Q2 = math.min(Q2, total)
    Q1 = math.min(Q1, total - Q2)
  end
end

-- prio_refilled applies a refill from t0 tokens (those stored, or nil) to t.
local function prio_refilled(t0, t, burst)
  if J1 or J2 then
    if t >= burst then
      J1, J2 = nil, nil
    elseif t0 and t > t0 then
      if J1 then J1 = J1 + (t - t0) end
      if J2 then J2 = J2 + (t - t0) end
    end
  end
  prio_norm(t)
end

local function prio_allow(j, s, burst)
  if not j then return burst end
  return math.min((1 - s) * j, burst)
end

-- prio_class returns the effective rank of a take of rank c and cost k from
-- t tokens, the tokens it pushes lower ranks back by, and the tokens it
-- sees; s1 and s2 are the shares of ranks 1 and 2.
local function prio_class(t, c, k, s1, s2, burst)
  local pushed = 0
  if t < k then pushed = k - math.max(0, t) end
  local e = c
  if pushed > 0 then
    if c < 1 and Q1 > 0 and s1 > 0 and prio_allow(J1, s1, burst) < pushed then e = 1 end
    if c < 2 and Q2 > 0 and s2 > 0 and prio_allow(J2, s2, burst) < pushed then e = 2 end
  end
  local v = t
  if e < 1 then v = v + Q1 end
  if e < 2 then v = v + Q2 end
  return e, pushed, v
end

local function prio_spend(j, s, pushed, burst)
  local limit = burst / (1 - s)
  local v = limit
  if j then v = math.min(j, limit) end
  return v - pushed / (1 - s)
end

-- prio_grant records a granted take of effective rank e that pushed lower
-- ranks back by pushed. It returns the ranks pushed with their counters,
-- "RANK:COUNTER_MILLI ...", or nil.
local function prio_grant(e, pushed, s1, s2, burst)
  if not (pushed > 0) then return nil end
  if e == 1 then Q1 = Q1 + pushed elseif e == 2 then Q2 = Q2 + pushed end
  local moved = nil
  if e < 1 and Q1 > 0 then
    P1 = P1 + pushed
    if s1 > 0 then J1 = prio_spend(J1, s1, pushed, burst) end
    moved = string.format('1:%d', milli(P1))
  end
  if e < 2 and Q2 > 0 then
    P2 = P2 + pushed
    if s2 > 0 then J2 = prio_spend(J2, s2, pushed, burst) end
    local m = string.format('2:%d', milli(P2))
    if moved then moved = moved .. ' ' .. m else moved = m end
  end
  return moved
end

-- prio_announce publishes a take's pushes on the bucket's channel (see
-- Store.Watch).
local function prio_announce(channel, now, pushed, moved)
  if moved then
    redis.call('PUBLISH', channel, string.format('push %d %d %s', now, milli(pushed), moved))
  end
end

-- prio_counter returns rank e's push counter (0 for rank 0).
local function prio_counter(e)
  if e == 1 then return P1 elseif e == 2 then return P2 end
  return 0
end

-- prio_refund takes a cancelled reservation of k tokens off rank e's queue.
local function prio_refund(e, k)
  if e == 1 then Q1 = Q1 - math.min(Q1, k) elseif e == 2 then Q2 = Q2 - math.min(Q2, k) end
end

-- prio_hset writes tokens and ts, and the fields that changed since
-- prio_read, in one HSET; a j back to a whole burst is deleted.
local function prio_hset(skey, tokens, ts)
  prio_norm(tokens)
  if Q1 == (RQ1 or 0) and Q2 == (RQ2 or 0) and P1 == (RP1 or 0) and P2 == (RP2 or 0) and J1 == RJ1 and J2 == RJ2 then
    redis.call('HSET', skey, 'tokens', tokens, 'ts', ts)
    return
  end
  local a = {'tokens', tokens, 'ts', ts}
  if Q1 ~= (RQ1 or 0) then a[#a + 1] = 'q1'; a[#a + 1] = Q1 end
  if Q2 ~= (RQ2 or 0) then a[#a + 1] = 'q2'; a[#a + 1] = Q2 end
  if P1 ~= (RP1 or 0) then a[#a + 1] = 'p1'; a[#a + 1] = P1 end
  if P2 ~= (RP2 or 0) then a[#a + 1] = 'p2'; a[#a + 1] = P2 end
  if J1 and J1 ~= RJ1 then a[#a + 1] = 'j1'; a[#a + 1] = J1 end
  if J2 and J2 ~= RJ2 then a[#a + 1] = 'j2'; a[#a + 1] = J2 end
  redis.call('HSET', skey, unpack(a))
  if RJ1 and not J1 then redis.call('HDEL', skey, 'j1') end
  if RJ2 and not J2 then redis.call('HDEL', skey, 'j2') end
  RQ1, RQ2, RP1, RP2, RJ1, RJ2 = Q1, Q2, P1, P2, J1, J2
end
`
