-- layers_charge_quota.lua: the body of layersChargeQuotaScript, after
-- math.lua and layer_prelude.lua.
--
-- layersChargeQuotaScript adds to quotas and budgets what a replica's
-- local fallback used while Redis was down (Layered.ChargeLayers).
--
-- KEYS: one quota or budget key each. ARGV: now_us (0: TIME), then 3
-- values per key: the start and end (µs) of the window the use belongs
-- to, and the tokens or millionths to add. A key is charged only while now
-- is in that window; a key holding an earlier window's use starts this
-- one's. Reply: how many keys were charged.

local now = tonumber(ARGV[1])
if not (now and now > 0) then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local n = 0
for i = 1, #KEYS do
  local a = 1 + (i - 1) * 3
  local s, e, add = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  if now >= s and now < e then
    quota_save(KEYS[i], e, quota_used(KEYS[i], e) + add, now)
    n = n + 1
  end
end
return n
