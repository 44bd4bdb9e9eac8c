package redislimiter

import "github.com/redis/go-redis/v9"

// mathLua holds clamp and wait_us (lua/math.lua): the prelude's, and those
// of layersKeyedScript, which does without the rest of the prelude.
var mathLua = luaSource("math.lua")

// prelude holds the functions every bucket script shares (lua/prelude.lua,
// which includes adaptive.lua, warmup.lua, math.lua and priority.lua): a
// script is the prelude followed by its body. All times are microseconds,
// read with TIME inside the script.
var prelude = luaSource("prelude.lua")

// takeScript takes or reserves tokens: lua/take_fast.lua, the prelude, then
// lua/take.lua, whose header documents its KEYS, ARGV and reply (one string
// of nine integers, or the fast path's shorter ones).
var takeScript = redis.NewScript(takeSrc)

var takeSrc = takeFastLua + prelude + luaSource("take.lua")

// refundScript puts tokens back, up to burst, off the queue of the rank
// that reserved them: the prelude, then lua/refund.lua (KEYS, ARGV and reply
// in its header).
var refundScript = redis.NewScript(prelude + luaSource("refund.lua"))

// pauseScript stops refilling and granting for a while, and announces it:
// the prelude, then lua/pause.lua.
var pauseScript = redis.NewScript(prelude + luaSource("pause.lua"))

// resumeScript ends a pause now and announces it: the prelude, then
// lua/resume.lua.
var resumeScript = redis.NewScript(prelude + luaSource("resume.lua"))

// statusScript reads the bucket without changing it: the prelude, then
// lua/status.lua.
var statusScript = redis.NewScript(prelude + luaSource("status.lua"))

// drainScript empties the bucket, leaving a debt reserved ahead, and
// announces it: the prelude, then lua/drain.lua.
var drainScript = redis.NewScript(prelude + luaSource("drain.lua"))

// setOverrideScript replaces the override and announces it:
// lua/set_override.lua, without the prelude.
var setOverrideScript = redis.NewScript(luaSource("set_override.lua"))

// deleteScript deletes keys and announces it (an override cleared, a
// bucket reset): lua/delete.lua, without the prelude.
var deleteScript = redis.NewScript(luaSource("delete.lua"))

// leaveScript removes a replica from the heartbeat set: lua/leave.lua,
// without the prelude.
var leaveScript = redis.NewScript(luaSource("leave.lua"))

// fillScript fills the bucket to its effective burst, keeping a pause, and
// announces it: the prelude, then lua/fill.lua.
var fillScript = redis.NewScript(prelude + luaSource("fill.lua"))

// heartbeatScript records a live replica and its config, forgets the
// expired ones and counts the live ones: the prelude, then
// lua/heartbeat.lua.
var heartbeatScript = redis.NewScript(prelude + luaSource("heartbeat.lua"))

// replicasScript lists the live replicas with their configs: the prelude,
// then lua/replicas.lua.
var replicasScript = redis.NewScript(prelude + luaSource("replicas.lua"))
