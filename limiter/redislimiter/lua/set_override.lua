-- set_override.lua: setOverrideScript, on its own (no prelude).
--
-- setOverrideScript replaces the override and announces it.
--
-- KEYS: override. ARGV: rate, burst (0: keep the configured burst), ttl_ms
-- (0: none), channel.

redis.call('DEL', KEYS[1])
if tonumber(ARGV[2]) > 0 then
  redis.call('HSET', KEYS[1], 'rate', ARGV[1], 'burst', ARGV[2])
else
  redis.call('HSET', KEYS[1], 'rate', ARGV[1])
end
if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
redis.call('PUBLISH', ARGV[4], 'override')
return 1
