package redislimiter

import "github.com/redis/go-redis/v9"

// warmupStatusScript reads the warm-up state that takes left in the state
// hash: the prelude, then lua/warmup_status.lua (KEYS, ARGV and reply in its
// header).
var warmupStatusScript = redis.NewScript(prelude + luaSource("warmup_status.lua"))
