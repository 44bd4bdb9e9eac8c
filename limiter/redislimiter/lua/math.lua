-- math.lua: clamp and wait_us. prelude.lua includes it; layers_keyed.lua,
-- which does without the rest of the prelude, follows math.lua and
-- layer_prelude.lua (layersKeyedSrc).

local function clamp(x)
  if x ~= x then return 0 end
  if x > 1e15 then return 1e15 end
  if x < -1e15 then return -1e15 end
  return x
end

-- wait_us returns the microseconds needed to refill n tokens at rate.
local function wait_us(n, rate)
  return clamp(math.ceil(n * 1e6 / rate))
end
