-- paid_secret.lua: paidSecretScript, on its own (no prelude).
--
-- paidSecretScript keeps ARGV[1] in KEYS[1] unless it holds a secret
-- already, and returns the one it holds: of the replicas that start
-- together, the first wins.

redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
