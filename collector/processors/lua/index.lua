-- Index an expectation on one trace's state: add it as pending, move it to decided, or drop it.
-- Kept inside the trace's own JSON state (one key, one Cluster slot, no per-trace sets).
-- KEYS[1] state  KEYS[2] the trace's tombstone (read when the state is gone: see load_or_new)
-- ARGV[1] ttl ms: the life of a state created here; 'add' and 'touch' also give an existing
--   state at least that much life left (a pending expectation's evidence must outlive its
--   deadline, which is at most the ttl away)  ARGV[2] op: add|touch|done|drop
-- ARGV[3] reclaim ms: > 0 shortens the state's life to at most that (PEXPIRE LT; the trace is
--   complete and decided: a decision was judged on its complete coverage), 0 leaves it
-- ARGV[4..] ids
-- Returns {code, expiry before, expiry after} (expiries: see expiry_of); code 0: no state (nothing
--   done), 1: done, 2: see the end
local st, raw = load_or_new(KEYS[1], KEYS[2])
if not raw and ARGV[2] ~= 'add' then return {0, -2, -2} end
local old_exp = expiry_of(KEYS[1], raw)
local renew = ARGV[2] == 'add' or ARGV[2] == 'touch'
local reclaim = tonumber(ARGV[3])
-- Judged complete by someone (the sweeper, another instance) whose watermark may be ahead of the
-- one a batch applies its next span or marker with: complete_by_claims holds from now on.
if reclaim > 0 then st.dc = 1 end

for i = 4, #ARGV do
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
if raw and renew then
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and left < tonumber(ARGV[1]) then
    redis.call('SET', KEYS[1], dump_state(st), 'PX', ARGV[1])
  else
    redis.call('SET', KEYS[1], dump_state(st), 'KEEPTTL')
  end
elseif raw then
  redis.call('SET', KEYS[1], dump_state(st), 'KEEPTTL')
else
  redis.call('SET', KEYS[1], dump_state(st), 'PX', ARGV[1])
end
-- Only a trace nothing is pending on any more: another expectation still judged on it needs its
-- evidence until its own deadline. A trace of a session is never reclaimed: the session's
-- expectations (indexed under the session, not here) read it until the session is complete.
if reclaim > 0 and next(st.pe) == nil and next(st.ss) == nil then
  redis.call('PEXPIRE', KEYS[1], reclaim, 'LT')
  -- What outlives the reclaimed state: that the trace was complete and which expectations were
  -- decided on it, so a span arriving after the state is gone is late and revises them.
  if KEYS[2] then redis.call('SET', KEYS[2], cjson.encode(keys_of(st.de)), 'PX', ARGV[1]) end
end
-- 2: a decision recorded on a trace that is late already -- a span broke the completion claim
-- between its evaluation and now (the sweeper decided while a batch applied it): re-judge it.
local code = 1
if ARGV[2] == 'done' and st.l == 1 and #ARGV >= 4 then code = 2 end
return {code, old_exp, expiry_of(KEYS[1], true)}
