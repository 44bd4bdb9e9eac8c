-- dedupe.lua: claims, marks and releases of dedupe keys, one or many in
-- one call, each decided in turn (the whole call is atomic).
-- KEYS[i]: the i-th operation's key, PREFIX dedupe:NAMESPACE:{KEY}
-- ARGV[1]: the channel; then 3 values per operation: its kind (c: claim,
-- m: mark sent, r: release), the token (claim, release; "" for a mark)
-- and a TTL in ms (claim: the claim's, mark: the window; "" for a
-- release).
-- Values: "c"..token (claimed), "w"..token (claimed, someone waits: the
-- mark or release publishes the key on the channel), "s" (sent).
-- Reply: one integer per operation, small ones (a client boxes them
-- without allocating). A claim: 0 claimed (new, or the token's own,
-- extended), 1 sent, or 4 + the held claim's remaining TTL in ms (PTTL:
-- 2 and 3 for its -2 and -1). A mark (whoever holds the claim): 1. A
-- release (the token's claim only): 1 released, 0 the token held no
-- claim.
local channel = ARGV[1]
local out = {}

local function claim(key, token, ttl)
  -- A key seen for the first time, most of them: one command.
  if redis.call('SET', key, 'c' .. token, 'PX', ttl, 'NX') then
    return 0
  end
  local v = redis.call('GET', key)
  local kind = string.sub(v, 1, 1)
  if kind == 's' then
    return 1
  end
  local holder = string.sub(v, 2)
  if holder == token then
    redis.call('PEXPIRE', key, ttl)
    return 0
  end
  if kind == 'c' then
    redis.call('SET', key, 'w' .. holder, 'KEEPTTL')
  end
  return 4 + redis.call('PTTL', key)
end

local function mark(key, window)
  local v = redis.call('GET', key)
  redis.call('SET', key, 's', 'PX', window)
  if v and string.sub(v, 1, 1) == 'w' then
    redis.call('PUBLISH', channel, key)
  end
  return 1
end

local function release(key, token)
  local v = redis.call('GET', key)
  if not v then
    return 0
  end
  local kind = string.sub(v, 1, 1)
  if kind == 's' or string.sub(v, 2) ~= token then
    return 0
  end
  redis.call('DEL', key)
  if kind == 'w' then
    redis.call('PUBLISH', channel, key)
  end
  return 1
end

for i = 1, #KEYS do
  local a = 2 + (i - 1) * 3
  local op = ARGV[a]
  if op == 'c' then
    out[i] = claim(KEYS[i], ARGV[a + 1], ARGV[a + 2])
  elseif op == 'm' then
    out[i] = mark(KEYS[i], ARGV[a + 2])
  else
    out[i] = release(KEYS[i], ARGV[a + 1])
  end
end
return out
