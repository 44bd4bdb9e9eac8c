-- delete.lua: deleteScript, on its own (no prelude).
--
-- deleteScript deletes KEYS and announces ARGV[2] on channel ARGV[1]. It
-- clears an override and resets a bucket.

redis.call('DEL', unpack(KEYS))
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
