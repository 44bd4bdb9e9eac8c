-- set_override.lua: setOverrideScript, on its own (no prelude).
--
-- setOverrideScript replaces the override, or clears it when the rate is
-- "", and announces it. The bucket refills lazily, from its state's ts at
-- the rate in force when it is next read, so the new rate applies from ts:
-- that instant is recorded as the change ("chg", State.Changed) when the
-- state exists, for the replicas to move their reservations from.
--
-- KEYS: state, override. ARGV: rate ("" to clear), burst (0: keep the
-- configured burst), ttl_ms (0: none), channel.

redis.call('DEL', KEYS[2])
if ARGV[1] ~= '' then
  if tonumber(ARGV[2]) > 0 then
    redis.call('HSET', KEYS[2], 'rate', ARGV[1], 'burst', ARGV[2])
  else
    redis.call('HSET', KEYS[2], 'rate', ARGV[1])
  end
  if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
end
local ts = tonumber(redis.call('HGET', KEYS[1], 'ts'))
if ts then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('HSET', KEYS[1], 'chg', string.format('%d', math.min(ts, now)))
end
redis.call('PUBLISH', ARGV[4], 'override')
return 1
