-- Compare-and-set one expectation's decision. A decision is final: only a higher
-- version (a revision) may replace it. Idempotent for the same version.
-- Touches only the expectation's own hash (one Cluster slot).
-- KEYS[1] decision hash  KEYS[2] the expectation's cancellation (same hash tag)
-- ARGV[1] version  ARGV[2] score id  ARGV[3] score event bytes  ARGV[4] observation bytes
-- ARGV[5] verdict  ARGV[6] ttl ms  ARGV[7] the decision's time (ms; kept as 'at': a loser reads
-- how long its winner has had to publish it)
-- Returns {won (1/0), stored version, published (1/0), stored verdict ('' when won)}; {0, -1, 1, ''}
-- for a cancelled expectation (judged before its cancel was processed: nothing is stored or sent)
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then return {0, -1, 1, ''} end
local cur = redis.call('HMGET', KEYS[1], 'v', 'pub', 'verdict')
local version = tonumber(ARGV[1])
if cur[1] and tonumber(cur[1]) >= version then
  return {0, tonumber(cur[1]), tonumber(cur[2]), cur[3] or ''}
end
redis.call('HSET', KEYS[1], 'v', version, 'sid', ARGV[2], 'ev', ARGV[3], 'ob', ARGV[4], 'pub', 0, 'verdict', ARGV[5],
  'at', ARGV[7] or 0)
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {1, version, 0, ''}
