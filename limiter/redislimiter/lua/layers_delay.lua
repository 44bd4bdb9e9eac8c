-- layers_delay.lua: the body of layersDelayScript, after math.lua and
-- layer_prelude.lua.
--
-- layersDelayScript takes from layer buckets the tokens that a granted
-- request's later send costs them: the request was charged for one instant
-- and goes out later (a push or a rate change moved its reservation on
-- the shared bucket), so the refill between the two instants is not there
-- to be spent by the key's next message (limiter's LayeredMemory.DelayLayersAt).
--
-- KEYS: one key per layer bucket. ARGV: now_us (0: TIME), from_us (the
-- instant the request was charged to go out at), to_us (the instant it
-- goes out now); then 3 values per key: rate, burst, and the tokens to take
-- at least (min(delay * rate, cost)); then each key's field (key_fields),
-- and the request's cost. A key takes more when the new instant is ahead
-- and it would still hold more than burst - cost there (tokens now plus
-- the refill until then): the cap at the burst applies only when a key is
-- read, so that refill would count (backend.DelayCharge). A key charged since for a message that goes
-- out after from_us (its last send instant) keeps the two apart only if it
-- still holds the debit at that instant; when a key does not, nothing is
-- taken and the reply is 0: the request must be decided again. Else every
-- key is debited, its last send instant becomes to_us if later, and the
-- reply is 1 (limiter's LayeredMemory.DelayLayersAt).

local now = tonumber(ARGV[1])
if not (now and now > 0) then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local from, to = tonumber(ARGV[2]), tonumber(ARGV[3])
local tok, lts, chg = {}, {}, {}
local F = key_fields(ARGV[4 + 3 * #KEYS])
local cost = tonumber(ARGV[5 + 3 * #KEYS]) or 0
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 3
  local rate, burst = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  tok[i], lts[i] = bucket_load(KEYS[i], F[i], now, rate, burst)
  chg[i] = tonumber(ARGV[a + 3])
  if cost > 0 then
    local ahead = to - lts[i]
    if ahead < 0 then ahead = 0 end
    local over = tok[i] + ahead * rate / 1e6 - (burst - cost)
    if over > chg[i] then chg[i] = over end
  end
  local last = LAST[KEYS[i] .. (F[i] or '')]
  if last > from then
    local ahead = last - lts[i]
    if ahead < 0 then ahead = 0 end
    local at = tok[i] + ahead * rate / 1e6
    if at > burst then at = burst end
    if at - chg[i] < 0 then return 0 end
  end
end
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 3
  bucket_save(KEYS[i], F[i], tok[i] - chg[i], lts[i], now, tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), to)
end
return 1
