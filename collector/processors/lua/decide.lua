-- Compare-and-set one expectation's decision. A decision is final: only a higher
-- version (a revision) may replace it. Idempotent for the same version.
-- KEYS[1] decision hash  KEYS[2] unpublished zset
-- ARGV[1] version  ARGV[2] score id  ARGV[3] score event bytes  ARGV[4] observation bytes
-- ARGV[5] verdict  ARGV[6] ttl ms  ARGV[7] now ms  ARGV[8] unpublished member
-- Returns {won (1/0), version, score id, event bytes, observation bytes, published, verdict}
local cur = redis.call('HMGET', KEYS[1], 'v', 'sid', 'ev', 'ob', 'pub', 'verdict')
local version = tonumber(ARGV[1])
if cur[1] and tonumber(cur[1]) >= version then
  return {0, tonumber(cur[1]), cur[2], cur[3], cur[4], tonumber(cur[5]), cur[6]}
end
redis.call('HSET', KEYS[1], 'v', version, 'sid', ARGV[2], 'ev', ARGV[3], 'ob', ARGV[4], 'pub', 0, 'verdict', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('ZADD', KEYS[2], ARGV[7], ARGV[8])
return {1, version, ARGV[2], ARGV[3], ARGV[4], 0, ARGV[5]}
