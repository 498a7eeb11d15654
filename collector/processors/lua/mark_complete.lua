-- Record a completion marker on one trace's state.
-- KEYS[1] state (holds the pending `pe` and decided `de` expectation ids)  KEYS[2] its tombstone
-- ARGV[1] ttl ms  ARGV[2] span count (-1 = unknown)  ARGV[3] marker event time ms
-- ARGV[4] global watermark ms  ARGV[5] allowed lateness ms  ARGV[6] inferred completion (1/0)
-- Returns JSON {pend=[...], dec=[...], sess=[the trace's sessions], ls=[its sessions, if this marker
--   made it late], state=<json>, o=<expiry before>, x=<expiry after>} (expiries: see expiry_of)
local st, raw = load_or_new(KEYS[1], KEYS[2])
local old_exp = expiry_of(KEYS[1], raw)
-- Already late (a late span, or a state recreated from its tombstone): what was decided on it was
-- re-judged then; a marker sent again is no new evidence.
local was_late = st.l == 1
local count = tonumber(ARGV[2])
local wm = tonumber(ARGV[4])
local lateness = tonumber(ARGV[5])
local inferred = ARGV[6] == '1'
if count >= 0 then
  -- Two claims of completion that disagree: neither proves anything any more, and a verdict
  -- decided on the first one is revised (late = the claim was broken).
  if (st.mc >= 0 and st.mc ~= count) or (st.mc < 0 and complete_by_claims(st, wm, lateness, inferred) and count ~= st.n) then
    st.r['conflicting_completion'] = 1; st.l = 1
  end
  st.mc = count
  if st.n > count then st.l = 1 end
end
-- A count-less claim holds from the earliest time it was made: a later marker must not move
-- completion back and make spans that are late for the first one look timely.
local at = tonumber(ARGV[3])
if st.ma < 0 or at < st.ma then st.ma = at end
local encoded = dump_state(st)
redis.call('SET', KEYS[1], encoded, 'PX', ARGV[1])
local dec = {}
local late_sessions = {}
if st.l == 1 and not was_late then dec = keys_of(st.de); late_sessions = keys_of(st.ss) end
return cjson.encode({pend = keys_of(st.pe), dec = dec, sess = keys_of(st.ss), ls = late_sessions, state = encoded,
  o = old_exp, x = expiry_of(KEYS[1], true)})
