-- adaptive.lua, included by prelude.lua: the part of the scripts' prelude that
-- computes the adaptive rate (limiter.Adaptive). The decrease script keeps it
-- in the bucket's override hash, which every script already reads in limits():
--
--   arate  the rate (tokens/s) at ats, written with %.17g
--   ats    µs: the climb starts here (the decrease, or the end of the pause then in force)
--   ainc   the climb in tokens/s per µs
--   adec   µs: the last decrease, for the merge window
--
-- SetOverride, ClearOverride and Reset delete the hash, so an operator's
-- override starts again from its own rate. The functions perform the same
-- floating-point operations in the same order as limiter's adaptiveCurve, so
-- that the Memory store and Redis pass the same step tables.
--
-- NOW is set by now_us; limits() sets CEIL (the override's or configured rate)
-- and AD (the curve, or nil when none is in force) and returns the adaptive
-- rate at NOW; load() integrates the refill over the curve.

local NOW, CEIL, AD = nil, nil, nil

local function ad_from(ov, ceil)
  local a, at, k = tonumber(ov[3]), tonumber(ov[4]), tonumber(ov[5])
  if not (a and at and k and NOW and ceil and ceil > 0) then return nil end
  if not (a > 0 and k >= 0) then return nil end
  return {a = a, at = at, k = k, ceil = ceil}
end

local function ad_rate(ad, t)
  local r = ad.a
  if t > ad.at then r = r + ad.k * (t - ad.at) end
  return math.min(r, ad.ceil)
end

local function ad_cum(ad, t)
  local u = t - ad.at
  local a = math.min(ad.a, ad.ceil)
  if u <= 0 or ad.k <= 0 or a >= ad.ceil then return a * u end
  local uc = (ad.ceil - a) / ad.k
  if u <= uc then return a * u + ad.k * u * u / 2 end
  return a * uc + ad.k * uc * uc / 2 + ad.ceil * (u - uc)
end
