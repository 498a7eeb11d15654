-- One tenant's traces in state: the sum of the buckets of its count (see count_move.lua) that end
-- after now (the server's clock). The buckets ended since the last read are taken out of the sum
-- and removed: each second since then is looked up (bucket ends are whole seconds, whatever the
-- bucket width), or, when that is more lookups than the hash has fields, every field is read.
-- KEYS[1] the tenant's count
-- Returns the sum.
local now = tonumber(redis.call('TIME')[1])
local p = tonumber(redis.call('HGET', KEYS[1], 'p') or -1)
if p >= now then return tonumber(redis.call('HGET', KEYS[1], 'n') or 0) end
local n = 0
if p < 0 or now - p > redis.call('HLEN', KEYS[1]) then
  if p < 0 and redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
  local all = redis.call('HGETALL', KEYS[1])
  local ended = {}
  for i = 1, #all, 2 do
    local b = tonumber(all[i])
    if b then
      if b > now then n = n + tonumber(all[i + 1]) else table.insert(ended, all[i]) end
    end
  end
  for i = 1, #ended, 1000 do
    redis.call('HDEL', KEYS[1], unpack(ended, i, math.min(i + 999, #ended)))
  end
else
  n = tonumber(redis.call('HGET', KEYS[1], 'n') or 0)
  for b = p + 1, now do
    local v = redis.call('HGET', KEYS[1], b)
    if v then
      n = n - tonumber(v)
      redis.call('HDEL', KEYS[1], b)
    end
  end
end
redis.call('HSET', KEYS[1], 'n', n, 'p', now)
return n
