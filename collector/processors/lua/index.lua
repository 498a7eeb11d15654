-- Index an expectation on one trace's state: add it as pending, move it to decided, or drop it.
-- Kept inside the trace's own JSON state (one key, one Cluster slot, no per-trace sets).
-- KEYS[1] state  ARGV[1] ttl ms (for a state created here)  ARGV[2] op: add|done|drop  ARGV[3..] ids
local raw = redis.call('GET', KEYS[1])
local st
if raw then
  st = load_state(raw)
else
  if ARGV[2] ~= 'add' then return 0 end
  st = new_state()
end
for i = 3, #ARGV do
  local id = ARGV[i]
  if ARGV[2] == 'add' then
    if not st.de[id] then st.pe[id] = 1 end
  elseif ARGV[2] == 'done' then
    st.pe[id] = nil
    st.de[id] = 1
  else
    st.pe[id] = nil
    st.de[id] = nil
  end
end
if raw then
  redis.call('SET', KEYS[1], dump_state(st), 'KEEPTTL')
else
  redis.call('SET', KEYS[1], dump_state(st), 'PX', ARGV[1])
end
return 1
