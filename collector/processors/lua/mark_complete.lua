-- Record a completion marker on one trace's state.
-- KEYS[1] state  KEYS[2] pending set  KEYS[3] decided set
-- ARGV[1] ttl ms  ARGV[2] span count (-1 = unknown)  ARGV[3] marker event time ms
-- Returns JSON {pend=[...], dec=[...], state=<json>}
local raw = redis.call('GET', KEYS[1])
local st
if raw then
  st = cjson.decode(raw)
else
  st = {n = 0, s = {}, x = {}, r = {}, p = {}, re = 0, me = 0, mc = -1, ma = -1, l = 0, ss = {}}
end
local count = tonumber(ARGV[2])
if count >= 0 then
  if st.mc >= 0 and st.mc ~= count then st.r['conflicting_completion'] = 1 end
  st.mc = count
  if st.n > count then st.l = 1 end
end
st.ma = tonumber(ARGV[3])
local encoded = cjson.encode(st)
redis.call('SET', KEYS[1], encoded, 'PX', ARGV[1])
local dec = {}
if st.l == 1 then dec = redis.call('SMEMBERS', KEYS[3]) end
return cjson.encode({pend = redis.call('SMEMBERS', KEYS[2]), dec = dec, state = encoded})
