-- take_full_again.lua, included by take_fast.lua: the part of take_fast.lua
-- that replies with the instant alone (fullAgainResult). n is the EXISTS of
-- both keys.
  if n == 0 and not ARGV[6] then
    -- A normal take on Redis's clock, no warm-up, no state and no
    -- override: the bucket is full at the configured rate. When it is
    -- full again within a microsecond (below), the reply is only the
    -- instant: the client knows the rest (fullAgainResult).
    local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
    if cost <= burst then
      local got, left = cost, burst - cost
      if ARGV[4] ~= '0' and left >= 1 then got = got + math.min(tonumber(ARGV[4]), math.floor(left)) end
      if got * 1e6 <= rate then return TAKE_NOW end
    end
  end
