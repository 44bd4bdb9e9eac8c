-- priority.lua, included by prelude.lua: the part of the scripts' prelude for
-- priority classes (see the priority state in package limiter's priority.go,
-- whose prio has the same arithmetic in the same order). The state hash holds,
-- beside tokens and ts, the fields q0 q2 (tokens reserved by ranks 0 and 2;
-- rank 1's are the rest), p1 p2 (the push counters of ranks 1 and 2) and j1 j2
-- (the jump allowances over them, in refilled tokens); a missing field is 0, a
-- missing j a whole burst (nil). load() reads them in its HMGET into Q0 Q2 P1
-- P2 J1 J2 (and RQ0... as read) and calls prio_refilled; save() writes, in its
-- HSET, only those that changed (prio_hset). A bucket used by rank 1 alone, the
-- default, so writes none. The functions are few on purpose: every call of a
-- script makes a closure of each. It needs milli.
--
-- {{MIN_QUEUED}} is limiter's minQueued, the least reservation of rank 1 that
-- counts (minQueuedLua).

local Q0, Q2, P1, P2, J1, J2 = 0, 0, 0, 0, nil, nil
local RQ0, RQ2, RP1, RP2, RJ1, RJ2 = nil, nil, nil, nil, nil, nil

-- prio_refilled applies a refill from t0 tokens (those stored, or nil) to
-- t: a full bucket restores the allowances, the others grow by the tokens
-- refilled; the refill repays the front of the queue.
local function prio_refilled(t0, t, burst)
  if J1 or J2 then
    if t >= burst then
      J1, J2 = nil, nil
    elseif t0 and t > t0 then
      if J1 then J1 = J1 + (t - t0) end
      if J2 then J2 = J2 + (t - t0) end
    end
  end
  if Q0 > 0 or Q2 > 0 then
    local total = math.max(0, -t)
    if t0 and t > t0 then
      local r = math.max(0, -t0) - total
      if r > 0 then Q0 = Q0 - math.min(Q0, r) end
    end
    Q0 = math.min(Q0, total)
    Q2 = math.min(Q2, total - Q0)
  end
end

-- prio_class returns, for a take of rank c and cost k from t tokens, the
-- tokens it pushes lower ranks back by, the tokens it sees, rank 1's
-- reservations, and the refill its floors need first (0: none); s1 and s2
-- are the shares of ranks 1 and 2. A rank is jumped only while its
-- allowance, min((1 - s) * j, burst), covers the push.
local function prio_class(t, c, k, s1, s2, burst)
  local pushed = 0
  if t < k then pushed = k - math.max(0, t) end
  if c == 2 or (c == 1 and Q2 == 0) then return pushed, t, 0, 0 end
  local q1 = math.max(0, -t) - Q0 - Q2
  if q1 < {{MIN_QUEUED}} then q1 = 0 end
  local need = 0
  if pushed > 0 then
    if c < 1 and q1 > 0 and s1 > 0 then
      local a = J1 and math.min((1 - s1) * J1, burst) or burst
      if a < pushed then need = math.max(need, (pushed - a) / (1 - s1)) end
    end
    if c < 2 and Q2 > 0 and s2 > 0 then
      local a = J2 and math.min((1 - s2) * J2, burst) or burst
      if a < pushed then need = math.max(need, (pushed - a) / (1 - s2)) end
    end
  end
  local v = t
  if c < 1 then v = v + q1 end
  if c < 2 then v = v + Q2 end
  return pushed, v, q1, need
end

-- prio_lower_limit returns j (nil: none yet), capped at burst / (1 - s),
-- lowered by the push of pushed tokens against share s (s > 0).
local function prio_lower_limit(j, s, pushed, burst)
  local limit = burst / (1 - s)
  return (j and math.min(j, limit) or limit) - pushed / (1 - s)
end

-- prio_grant records a granted take of rank c that pushed lower ranks back
-- by pushed, rank 1 having held q1 tokens reserved, and announces the
-- push on channel (nil: the one named after the state key KEYS[1]; see
-- Store.Watch): "push NOW_US TOKENS_MILLI RANK:COUNTER_MILLI...".
local function prio_grant(c, pushed, q1, s1, s2, burst, channel, now)
  if not (pushed > 0) then return end
  if c == 0 then Q0 = Q0 + pushed elseif c == 2 then Q2 = Q2 + pushed end
  local moved = nil
  if c < 1 and q1 > 0 then
    P1 = P1 + pushed
    if s1 > 0 then J1 = prio_lower_limit(J1, s1, pushed, burst) end
    moved = string.format('1:%d', milli(P1))
  end
  if c < 2 and Q2 > 0 then
    P2 = P2 + pushed
    if s2 > 0 then J2 = prio_lower_limit(J2, s2, pushed, burst) end
    local m = string.format('2:%d', milli(P2))
    if moved then moved = moved .. ' ' .. m else moved = m end
  end
  if moved then
    if not channel then channel = string.sub(KEYS[1], 1, -6) .. 'changes' end
    redis.call('PUBLISH', channel, string.format('push %d %d %s', now, milli(pushed), moved))
  end
end

-- prio_refund takes a cancelled reservation of k tokens off rank e's queue
-- (rank 1's shrinks with the tokens).
local function prio_refund(e, k)
  if e == 0 then Q0 = Q0 - math.min(Q0, k) elseif e == 2 then Q2 = Q2 - math.min(Q2, k) end
end

-- prio_hset writes tokens and ts, and the fields that changed since load,
-- in one HSET, after prio_refilled for the tokens saved; a j back to a
-- whole burst is deleted. x, when not nil, is the key's new expiry for
-- the "x" field (save). Numbers go as num() strings, which Redis stores
-- as it would the numbers, at less cost.
local function prio_hset(skey, tokens, ts, burst, x)
  prio_refilled(nil, tokens, burst)
  local same = P1 == (RP1 or 0) and P2 == (RP2 or 0) and J1 == RJ1 and J2 == RJ2
  if same and Q0 == (RQ0 or 0) then
    if Q2 == (RQ2 or 0) then
      if x then
        redis.call('HSET', skey, 'tokens', num(tokens), 'ts', num(ts), 'x', x)
      else
        redis.call('HSET', skey, 'tokens', num(tokens), 'ts', num(ts))
      end
    else -- a low reservation, or low's repaid
      if x then
        redis.call('HSET', skey, 'tokens', num(tokens), 'ts', num(ts), 'q2', num(Q2), 'x', x)
      else
        redis.call('HSET', skey, 'tokens', num(tokens), 'ts', num(ts), 'q2', num(Q2))
      end
      RQ2 = Q2
    end
    return
  end
  local a = {'tokens', num(tokens), 'ts', num(ts)}
  if x then a[5] = 'x'; a[6] = x end
  if Q0 ~= (RQ0 or 0) then a[#a + 1] = 'q0'; a[#a + 1] = num(Q0) end
  if Q2 ~= (RQ2 or 0) then a[#a + 1] = 'q2'; a[#a + 1] = num(Q2) end
  if P1 ~= (RP1 or 0) then a[#a + 1] = 'p1'; a[#a + 1] = num(P1) end
  if P2 ~= (RP2 or 0) then a[#a + 1] = 'p2'; a[#a + 1] = num(P2) end
  if J1 and J1 ~= RJ1 then a[#a + 1] = 'j1'; a[#a + 1] = num(J1) end
  if J2 and J2 ~= RJ2 then a[#a + 1] = 'j2'; a[#a + 1] = num(J2) end
  redis.call('HSET', skey, unpack(a))
  if RJ1 and not J1 then redis.call('HDEL', skey, 'j1') end
  if RJ2 and not J2 then redis.call('HDEL', skey, 'j2') end
  RQ0, RQ2, RP1, RP2, RJ1, RJ2 = Q0, Q2, P1, P2, J1, J2
end
