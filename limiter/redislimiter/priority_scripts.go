package redislimiter

// minQueuedLua is limiter's minQueued, the least reservation of rank 1
// that counts.
const minQueuedLua = "1e-9"
