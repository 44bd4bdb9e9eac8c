-- layers_refund.lua: the body of layersRefundScript, after prelude.lua and
-- layer_prelude.lua (layerPrelude).
--
-- layersRefundScript gives back what layersScript charged. A quota is
-- refunded only while its stored window is the one charged.
--
-- KEYS: as layersScript. ARGV: now_us, cost, shared (1/0), shared rate,
-- shared burst, n, rank (whose queue on the shared bucket held the
-- reservation); then 4 values per layer: kind (b, q, or m: a budget),
-- rate, quota or budget, burst (a budget: the price charged), and for a
-- quota or budget the end of the window charged; last, the warm-up in µs, as
-- in layersScript: the shared bucket refills along a ramp in progress up to
-- now (but a refund starts no ramp), and its key lives the warm-up longer;
-- then, optionally, leased: shared tokens granted beyond the cost (a
-- lease taken with the message, never queued), given back to the shared
-- bucket too (a Cluster's first step, whose later step refused; 0 for
-- none); then each key's field (key_fields).
-- Reply: 1.

local now = now_us(ARGV[1])
local cost = tonumber(ARGV[2])
local n = tonumber(ARGV[6])
local kb = 0
if ARGV[3] == '1' then
  kb = 2
  local rate, burst = limits(KEYS[2], tonumber(ARGV[4]), tonumber(ARGV[5]))
  WARM, WKEEP = tonumber(ARGV[8 + 4 * n]), true -- warmup.lua: along a ramp, starting none
  if WARM and WARM <= 0 then WARM = nil end
  local tokens, ts = load(KEYS[1], now, rate, burst)
  prio_refund(tonumber(ARGV[7]), cost)
  local leased = tonumber(ARGV[9 + 4 * n]) or 0
  save(KEYS[1], math.min(burst, tokens + cost + leased), ts, now, rate, burst)
end
local F = key_fields(ARGV[10 + 4 * n])
for i = 1, n do
  local a = 7 + (i - 1) * 4
  local key, field = KEYS[kb + i], F[kb + i]
  local r, b = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  if ARGV[a + 1] == 'q' or ARGV[a + 1] == 'm' then
    local c = cost
    if ARGV[a + 1] == 'm' then c = b end
    local e = tonumber(ARGV[a + 4])
    local se, su = num2(redis.call('GET', key))
    if se == e and su and e > now then
      quota_save(key, e, math.max(0, su - c), now)
    end
  else
    local tokens, ts = bucket_load(key, field, now, r, b)
    bucket_save(key, field, math.min(b, tokens + cost), ts, now, r, b)
  end
end
return 1
