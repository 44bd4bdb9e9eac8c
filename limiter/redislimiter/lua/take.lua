-- take.lua: the body of takeScript, after take_fast.lua and prelude.lua.
--
-- takeScript takes or reserves tokens.
--
-- KEYS: state, override. ARGV: rate, burst, cost, extra, max_wait_us, now_us,
-- warmup_us (0 or absent: none; see warmup.lua), rank (the class's rank,
-- limiter.Priority.Rank; absent: 1), share1, share2 (the MinShare of ranks 1
-- and 2; absent: 0), channel (for the push announcement), hold_us (absent or
-- 0: none; backend.TakeRequest.Hold: the take is charged as of now +
-- hold_us, as send_charge in layer_prelude.lua charges a late send, the
-- refill the bucket would lose to its burst by then counted into its cost;
-- a lease's tokens go out at any instant up to then). Reply: one string
-- of nine integers separated by spaces: granted (1, 0, -1 when cost >
-- burst, or 2 when a lower rank's MinShare refused it: wait_us is then the
-- time until it would not), tokens, wait_us, remaining_milli,
-- effective_rate_milli, burst, now_us, rank (whose queue holds the
-- reservation), pushed_milli (that rank's push counter). One string costs the
-- client two
-- allocations to read, where an array of nine integers costs up to eleven.

local now = now_us(TAKE_NOW)
REALMS = TAKE_REAL
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), TAKE_NOOV)
local cost, extra, max_wait = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local rank, s1, s2 = tonumber(ARGV[8]) or 1, tonumber(ARGV[9]) or 0, tonumber(ARGV[10]) or 0
WARM = tonumber(ARGV[7]) -- warmup.lua
if WARM and WARM <= 0 then WARM = nil end
local tokens, ts = load(KEYS[1], now, rate, burst, TAKE_ST)
if WRATE then rate = WRATE end -- warmup.lua: a cold start or a ramp in progress
local eff = rate
if ts > now then eff = 0 end
-- charge: the cost, plus the refill lost to the burst by the hold's end.
local charge, hold = cost, tonumber(ARGV[12]) or 0
if hold > 0 then
  local ahead = now + hold - ts
  if ahead < 0 then ahead = 0 end
  local lost = tokens + ahead * rate / 1e6 - burst
  if lost > 0 then charge = cost + lost end
end
local pushed, visible, q1, need = prio_class(tokens, rank, charge, s1, s2, burst)
local function reply(granted, got, wait, remaining)
  local p = 0
  if rank == 1 then p = P1 elseif rank == 2 then p = P2 end
  return string.format('%d %d %d %d %d %d %d %d %d', granted, got, wait, milli(remaining), milli(eff), burst, now, rank, milli(p))
end
if cost > burst then return reply(-1, 0, 0, tokens) end
if need > 0 then return reply(2, 0, clamp((ts - now) + wait_us(need, rate)), tokens) end
local after = visible - charge
local wait = ts - now
if after < 0 then wait = clamp(wait + wait_us(-after, rate)) end
local got, left = cost, tokens - charge
if wait <= 0 then
  wait = 0
  if extra > 0 and left >= 1 then
    local k = math.min(extra, math.floor(left))
    left = left - k
    got = got + k
  end
else
  local horizon = 0
  if max_wait > 0 then horizon = math.max(max_wait, wait_us(cost, rate)) end
  if wait > horizon then return reply(0, 0, wait - horizon, tokens) end
end
prio_grant(rank, pushed, q1, s1, s2, burst, ARGV[11], now)
save(KEYS[1], left, ts, now, rate, burst)
return reply(1, got, wait, left)
