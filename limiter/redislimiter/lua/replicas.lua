-- replicas.lua: the body of replicasScript, after prelude.lua.
--
-- replicasScript lists the live replicas with their configured "rate burst"
-- ("" when unknown).
--
-- KEYS: replicas, configs. ARGV: now_us. Reply: {id, config, id, config...}.

local now = now_us(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('(%d', now), '+inf')
local out = {}
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[2], id) or ''
end
return out
