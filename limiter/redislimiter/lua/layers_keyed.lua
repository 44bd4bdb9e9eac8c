-- layers_keyed.lua: the body of layersKeyedScript, after math.lua and
-- layer_prelude.lua (layersKeyedSrc).
--
-- layersKeyedScript decides, for one or more requests in turn, layers that
-- are all token buckets, concurrency layers or send windows, without the shared bucket: what a Bucket sends
-- while its lease pays the shared bucket, and a Cluster's keyed steps. Each
-- request is decided as layersScript decides it with shared 0 and no
-- quota, and is atomic on its own (the whole call is, too).
--
-- It is layersScript's job at a fraction of its cost in Redis, with the
-- same layer functions (layer_prelude.lua) and clamp and wait_us (math.lua): it
-- does not carry the rest of the shared bucket's prelude (adaptive rate,
-- warm-up, overrides), whose functions Redis would re-create on every call; the
-- layers'
-- constants come once per call, not once per request; TIME is read once
-- per call; and the reply is one string. A batch of concurrent requests is
-- one call (see layerBatcher).
--
-- KEYS: each request's key of every layer, request by request; or, when
-- the keys come in ARGV (below), one key that routes the call to its
-- master on a Cluster. ARGV: now_us (0: TIME), n (layers per request),
-- where the keys are ("": KEYS; "a": in ARGV, at the end of each request's
-- values); then 6 values per layer: index
-- (1-based, named in the reply), kind (b: bucket, c: concurrency, o: send
-- window, as in layersScript), rate (a concurrency layer's limit), burst
-- (its lease in µs), action (w: wait, d: dead_letter, y: delay),
-- max_wait_us; then 4 values per request, and one more per send window:
-- the holder of its concurrency slots, cost, base_us (when the request
-- goes out, after now: the shared bucket's wait on a Cluster, 0 under a
-- lease), the paid layers as in layersScript (for each layer, the last
-- instant in µs at which it passes on a paid slot, or 0; "" for none),
-- and each send window's open intervals for this request, in layer order
-- (backend.FormatSpans; "" always open; its key is never read, and it is
-- charged nothing), then, with the keys in ARGV, its n keys. Every layer
-- is decided and charged for now+base_us, as layersScript does. Last, each
-- key's field (key_fields: a keyed token bucket's in its shard, none for
-- the others).
--
-- With the keys in ARGV (a Cluster's batch: the requests whose keys one
-- master holds, over many slots; layersKeyedClusterScript, which declares
-- allow-cross-slot-keys), each request's keys are checked, just before the
-- request is decided, to be served by this node (an EXISTS under pcall,
-- which fails where the request's own commands would: a slot moved or
-- migrating); at the first that is not, the script stops, having decided
-- only the requests before it, and the reply ends with "m". Nothing of the
-- requests from there on was run.
--
-- Reply: one string, "now_us" followed by "status wait_us layer" for each
-- request decided (every request, but for the "m" above), separated by
-- spaces; status and layer as in layersScript
-- (status 1 granted, 0 not granted, 2 refused, 4 refused with the slot
-- booked on the delay layer, -2 cost above the layer's burst, -3 a send
-- window's intervals end before send: a clock skew); wait_us as
-- in layersScript, except for a grant, where it is when every layer had
-- room (limiter.LayerResult.LayersDue).

local now = tonumber(ARGV[1])
if not (now and now > 0) then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local n = tonumber(ARGV[2])
local inargv = ARGV[3] == 'a'
local idx, kind, rate, burst, action, maxw = {}, {}, {}, {}, {}, {}
local win, nw = {}, 0 -- a send window's place among the request's spans
for i = 1, n do
  local a = 3 + (i - 1) * 6
  idx[i], kind[i], rate[i], burst[i] = tonumber(ARGV[a + 1]), ARGV[a + 2], tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  action[i], maxw[i] = ARGV[a + 5], tonumber(ARGV[a + 6])
  if kind[i] == 'o' then
    nw = nw + 1
    win[i] = nw
  end
end

local tok, lts, w = {}, {}, {}
local out = {string.format('%d', now)}
local k0 = 0
local F = key_fields(ARGV[#ARGV])
local K, nk = KEYS, 0
if inargv then K, nk = {}, n end
for a = 4 + 6 * n, #ARGV - 1, 4 + nw + nk do
  if inargv then
    local here = true
    for i = 1, n do
      K[k0 + i] = ARGV[a + 3 + nw + i]
      if here and kind[i] ~= 'o' and type(redis.pcall('EXISTS', K[k0 + i])) == 'table' then
        here = false
      end
    end
    if not here then
      out[#out + 1] = 'm'
      break
    end
  end
  local holder, cost, base = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local send = now + base
  local paid, pdue, pbooked = paid_flags(ARGV[a + 3], send)
  local status, wait, limiting = nil, 0, 0
  for i = 1, n do
    if paid[i] then -- loaded here; a slot the state no longer holds does not count
      tok[i], lts[i] = bucket_load(K[k0 + i], F[k0 + i], now, rate[i], burst[i])
      if not paid_held(K[k0 + i], F[k0 + i], pdue[i], pbooked[i], now) then paid[i] = false end
    end
    if kind[i] == 'c' then
      w[i] = slot_wait(K[k0 + i], holder, rate[i], now)
    elseif kind[i] == 'o' then
      w[i] = window_wait(ARGV[a + 3 + win[i]], send, now)
      if not w[i] then
        status, limiting = -3, idx[i]
        break
      end
    elseif paid[i] then
      w[i] = 0
    elseif cost > burst[i] then
      status, limiting = -2, idx[i]
      break
    else
      tok[i], lts[i], w[i] = bucket_wait(K[k0 + i], F[k0 + i], now, cost, rate[i], burst[i])
    end
  end
  if not status then
    local r = refusal(n, action, w, maxw)
    if r > 0 then
      status = refused_status(r, K[k0 + r], F[k0 + r], kind[r], action[r], w[r], tok[r], lts[r], cost, now, rate[r], burst[r])
      wait, limiting = w[r], idx[r]
    else
      wait = base
      for i = 1, n do
        if w[i] > wait then wait, limiting = w[i], idx[i] end
      end
      if limiting > 0 then
        status = 0
      else
        -- wait: when every layer had room (limiter.LayerResult.LayersDue)
        status, wait = 1, 0
        for i = 1, n do
          if w[i] > wait then wait = w[i] end
        end
        for i = 1, n do
          if kind[i] == 'c' then
            slot_take(K[k0 + i], holder, send + burst[i], now)
          elseif kind[i] == 'o' then
            -- a window charges nothing
          else
            local after = send_charge(tok[i], lts[i], send, cost, paid[i], rate[i], burst[i])
            bucket_save(K[k0 + i], F[k0 + i], after, lts[i], now, rate[i], burst[i], send)
          end
        end
      end
    end
  end
  out[#out + 1] = string.format('%d %d %d', status, wait, limiting)
  k0 = k0 + n
end
return table.concat(out, ' ')
