-- warmup_status.lua: the body of warmupStatusScript, after prelude.lua.
--
-- warmupStatusScript reads the warm-up state that takes left in the state
-- hash: the last ramp's start (wts) and the warm-up period (wu) of the
-- replica that started it.
--
-- KEYS: state. ARGV: now_us. Reply: {state (0: no state, the next take
-- starts a ramp if warm-up is on; 1: state without a ramp recorded; 2: a
-- ramp recorded), wts, wu, ts, now}.

local now = now_us(ARGV[1])
local st = redis.call('HMGET', KEYS[1], 'ts', 'wts', 'wu')
local ts, wts, wu = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
if not ts then return {0, 0, 0, 0, now} end
if not wts or not wu then return {1, 0, 0, ts, now} end
return {2, wts, wu, ts, now}
