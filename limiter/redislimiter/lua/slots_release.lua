-- slots_release.lua: the body of slotsReleaseScript, after math.lua.
--
-- slotsReleaseScript gives back concurrency slots (layers.lua's kind c),
-- several in one call: for each key, the holder's member is removed, and
-- when the key held the limit before (ended leases included: an extra
-- announcement only makes a waiter ask again), the release is announced
-- on the channel, so that the replicas whose requests wait for that key
-- ask again at once. A set emptied goes with its last member.
--
-- It needs no clock: a lease that ended is removed as any other.
--
-- KEYS: one sorted set per slot. ARGV: channel; then 3 values per key:
-- holder, limit, the announcement ("slot LAYER KEY"). Reply: the number of
-- slots released.

local released = 0
for i = 1, #KEYS do
  local key = KEYS[i]
  local a = 1 + (i - 1) * 3
  local held = redis.call('ZCARD', key)
  if redis.call('ZREM', key, ARGV[a + 1]) == 1 then
    released = released + 1
    if held >= tonumber(ARGV[a + 2]) then
      redis.call('PUBLISH', ARGV[1], ARGV[a + 3])
    end
  end
end
return released
