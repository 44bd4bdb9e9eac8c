-- status.lua: the body of statusScript, after prelude.lua. {{MIN_QUEUED}}
-- is limiter's minQueued (minQueuedLua).
--
-- statusScript reads the bucket without changing it. The configured rate
-- and burst may be 0 for "unknown" (an Admin without them); then the
-- effective ones are known only from a valid override, and the tokens only
-- when both are known.
--
-- KEYS: state, override, replicas. ARGV: rate, burst, now_us.
-- Reply: {tokens_milli (or false when unknown), effective_rate_milli (the
-- refill rate apart from a pause, 0 when unknown), burst (0 when unknown),
-- paused_us, override_rate (verbatim, or false), override_burst (verbatim,
-- or false), override_ttl_ms, replicas, now_us, paused_by ("" when not
-- paused or unknown), reserved0_milli, reserved1_milli, reserved2_milli
-- (the tokens each rank holds reserved ahead), pushed1_milli, pushed2_milli
-- (the push counters of ranks 1 and 2); the last five are 0 when the
-- tokens are unknown, changed_us (the last change of settings, "chg",
-- State.Changed; 0 when unknown)}.

local now = now_us(ARGV[3])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local st = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'by', 'chg')
local paused, by = 0, ''
local ts = tonumber(st[2])
if ts and ts > now then paused = clamp(ts - now); by = st[3] or '' end
local tokens = false
local r0, r1, r2 = 0, 0, 0
if rate > 0 and burst > 0 then -- load reads the classes' state (priority.lua)
  local t = load(KEYS[1], now, rate, burst)
  tokens = milli(t)
  r0, r2 = Q0, Q2
  r1 = math.max(0, -t) - Q0 - Q2
  if r1 < {{MIN_QUEUED}} then r1 = 0 end
end
local ov = redis.call('HMGET', KEYS[2], 'rate', 'burst')
local ottl = redis.call('PTTL', KEYS[2])
local replicas = redis.call('ZCOUNT', KEYS[3], string.format('(%d', now), '+inf')
return {tokens, milli(rate), burst, paused, ov[1] or false, ov[2] or false, ottl, replicas, now, by,
  milli(r0), milli(r1), milli(r2), milli(P1), milli(P2), tonumber(st[4]) or 0}
