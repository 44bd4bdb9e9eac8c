-- release.lua: delete a token's claim of a dedupe key.
-- KEYS[1]: the key; ARGV[1]: the token; ARGV[2]: the channel
-- Publishes the key on the channel when the claim was waited for.
-- Reply: 1 released, 0 the token held no claim.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local kind = string.sub(v, 1, 1)
if kind == 's' or string.sub(v, 2) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if kind == 'w' then
  redis.call('PUBLISH', ARGV[2], KEYS[1])
end
return 1
