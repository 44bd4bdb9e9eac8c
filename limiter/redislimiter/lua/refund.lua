-- refund.lua: the body of refundScript, after prelude.lua.
--
-- refundScript puts tokens back, up to burst, and takes them off the queue
-- of the rank that reserved them (priority.lua). Tokens past their slot
-- (past = 1: an unused lease, a reservation woken too late) go back only
-- while no reservation is queued (tokens >= 0): the reservations queued
-- keep their instants, so tokens put back among them would go out beside
-- them, past the burst (backend.PastRefunder).
--
-- KEYS: state, override. ARGV: rate, burst, tokens, now_us, rank (0, or
-- absent: no class), warmup_us (0 or absent: none; the bucket refills along
-- a ramp in progress but starts none, warmup.lua), past (1: past the slot;
-- 0 or absent: a cancelled reservation). Reply: remaining_milli.

local now = now_us(ARGV[4])
local rate, burst = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
WARM, WKEEP = tonumber(ARGV[6]), true -- warmup.lua
if WARM and WARM <= 0 then WARM = nil end
local tokens, ts = load(KEYS[1], now, rate, burst)
local k = tonumber(ARGV[3])
if ARGV[7] == '1' and tokens < 0 then return milli(tokens) end
tokens = math.min(burst, tokens + k)
prio_refund(tonumber(ARGV[5]) or 0, k)
save(KEYS[1], tokens, ts, now, rate, burst)
return milli(tokens)
