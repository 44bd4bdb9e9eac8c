-- claim.lua: claim a dedupe key for a token.
-- KEYS[1]: the key, PREFIX dedupe:NAMESPACE:{KEY}
-- ARGV[1]: the token; ARGV[2]: the claim's TTL (ms)
-- Values: "c"..token (claimed), "w"..token (claimed, someone waits: the
-- mark or release publishes), "s" (sent).
-- Reply: "c" claimed (new, or the token's own, extended), "s" sent, or
-- the held claim's remaining TTL (ms, integer).
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], 'c' .. ARGV[1], 'PX', ARGV[2])
  return 'c'
end
local kind = string.sub(v, 1, 1)
if kind == 's' then
  return 's'
end
local holder = string.sub(v, 2)
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 'c'
end
if kind == 'c' then
  redis.call('SET', KEYS[1], 'w' .. holder, 'KEEPTTL')
end
return redis.call('PTTL', KEYS[1])
