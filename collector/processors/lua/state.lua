-- Shared by the trace-state scripts (prepended to each when it is registered): how one
-- trace's state is created, read and written. Empty maps and lists are left out of the
-- stored JSON (memory per trace is bounded).
local function new_state()
  return {n = 0, s = {}, x = {}, r = {}, p = {}, re = 0, mc = -1, ma = -1, l = 0, ss = {}, pe = {}, de = {}}
end
local function load_state(raw)
  local st = cjson.decode(raw)
  for _, k in ipairs({'s', 'x', 'r', 'p', 'ss', 'pe', 'de'}) do st[k] = st[k] or {} end
  return st
end
-- A trace's state, or a new one. A new one for a trace whose state was reclaimed (complete and
-- decided: its tombstone lists the decided ids) starts late -- every span now is late and its
-- decided expectations are revised -- and with its evidence gone: absence is never provable on it
-- again (a re-sent marker or retried export must not "complete" what is left).
local function load_or_new(state_key, tomb_key)
  local raw = redis.call('GET', state_key)
  if raw then return load_state(raw), true end
  local st = new_state()
  local gone = tomb_key and redis.call('GET', tomb_key)
  if gone then
    st.l = 1
    st.r['retention_expired'] = 1
    for _, id in ipairs(cjson.decode(gone)) do st.de[id] = 1 end
  end
  return st, false
end
-- The absolute expiry (ms, PEXPIRETIME) of a state key that exists (``present``), else -2 (none).
-- Scripts return it before and after they write: the caller keeps the per-tenant count of traces
-- in state from these (TraceStateStore.note_expiry; the count's key is in another slot).
local function expiry_of(key, present)
  if not present then return -2 end
  return redis.call('PEXPIRETIME', key)
end
local function dump_state(st)
  local out = {}
  for k, v in pairs(st) do
    if type(v) ~= 'table' or next(v) ~= nil then out[k] = v end
  end
  return cjson.encode(out)
end
-- Was the trace complete by its claims at watermark ``wm``: a count marker met, the watermark past
-- a count-less marker (+ lateness), or (inferred mode) past the ended root with no orphan? The
-- same rule as decide.trace_coverage, which judges it for verdicts -- and complete for good once a
-- decision was judged on it complete, at a watermark that may be ahead of ``wm``.
local function complete_by_claims(st, wm, lateness, inferred)
  if st.dc == 1 then return true end  -- a decision was judged on its complete coverage (index.lua)
  if st.mc >= 0 then return st.n >= st.mc end
  if st.ma >= 0 then return wm >= st.ma + lateness end
  if inferred and st.re > 0 and next(st.p) == nil then return wm >= st.re + lateness end
  return false
end
local function keys_of(t)
  local out = {}
  for k, _ in pairs(t or {}) do table.insert(out, k) end
  return out
end
