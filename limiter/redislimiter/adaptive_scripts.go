package redislimiter

import "github.com/redis/go-redis/v9"

// decreaseScript records a push-back for the adaptive rate (the rate in
// force times decrease, unless the last decrease is within the merge
// window) and announces it: the prelude, then lua/decrease.lua (KEYS, ARGV
// and reply in its header).
var decreaseScript = redis.NewScript(prelude + luaSource("decrease.lua"))

// adaptiveStatusScript reads the adaptive state: the prelude, then
// lua/adaptive_status.lua.
var adaptiveStatusScript = redis.NewScript(prelude + luaSource("adaptive_status.lua"))
