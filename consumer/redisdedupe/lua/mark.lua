-- mark.lua: mark a dedupe key sent, whoever holds its claim.
-- KEYS[1]: the key; ARGV[1]: the window (ms); ARGV[2]: the channel
-- Publishes the key on the channel when a claim of it was waited for.
-- Reply: 1.
local v = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], 's', 'PX', ARGV[1])
if v and string.sub(v, 1, 1) == 'w' then
  redis.call('PUBLISH', ARGV[2], KEYS[1])
end
return 1
