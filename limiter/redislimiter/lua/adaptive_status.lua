-- adaptive_status.lua: the body of adaptiveStatusScript, after prelude.lua.
--
-- adaptiveStatusScript reads the adaptive state.
--
-- KEYS: state, override. ARGV: rate (0: unknown), burst, now_us. Reply:
-- {on (1/0), rate_milli (at now), ceiling_milli, since_decrease_us (-1 when
-- never), now_us}.

local now = now_us(ARGV[3])
local rate = limits(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]))
local last = tonumber(redis.call('HGET', KEYS[2], 'adec'))
local since = -1
if last then since = clamp(now - last) end
local on = 0
if AD then on = 1 end
return {on, milli(rate), milli(CEIL or 0), since, now}
