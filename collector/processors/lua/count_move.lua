-- Move traces between the expiry buckets of one tenant's count of traces in state.
-- KEYS[1] the tenant's count, a hash: <bucket end, Unix s> -> traces whose state expires in that
--   bucket; 'n' -> the sum of those fields; 'p' -> the time (s) up to which ended buckets were
--   taken out (count_read). The trace scripts cannot write it (it is in another Cluster slot), so
--   they return their state's expiry before and after, and the service sends the moves here.
-- ARGV pairs: bucket end (s), delta (+1 a state expires in it now, -1 one no longer does)
-- A bucket already taken out (ended) is left alone: it counts for nothing any more. A field back at
-- 0 is removed; the hash lives until its last bucket ends.
local p = tonumber(redis.call('HGET', KEYS[1], 'p') or 0)
local top = 0
local n = 0
for i = 1, #ARGV, 2 do
  local b = tonumber(ARGV[i])
  if b > p then
    local d = tonumber(ARGV[i + 1])
    if redis.call('HINCRBY', KEYS[1], ARGV[i], d) == 0 then redis.call('HDEL', KEYS[1], ARGV[i]) end
    n = n + d
    if b > top then top = b end
  end
end
if top > 0 then
  redis.call('HINCRBY', KEYS[1], 'n', n)
  local at = top * 1000
  local cur = redis.call('PEXPIRETIME', KEYS[1])
  if cur < at then redis.call('PEXPIREAT', KEYS[1], at) end
end
return 0
