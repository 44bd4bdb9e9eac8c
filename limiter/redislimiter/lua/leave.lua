-- leave.lua: leaveScript, on its own (no prelude).
--
-- leaveScript removes a replica from the heartbeat set.
--
-- KEYS: replicas, configs, idle (optional). ARGV: id.

redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if KEYS[3] then redis.call('ZREM', KEYS[3], ARGV[1]) end
return 1
