-- Apply one batch of normalized span facts to one trace's state, atomically.
-- KEYS[1] state (JSON string; it also holds the trace's pending `pe` and decided `de` expectation ids)
-- KEYS[2] the trace's tombstone (written when a complete, decided trace's state is reclaimed)
-- ARGV[1] ttl ms  ARGV[2] JSON array of span facts  ARGV[3] max spans  ARGV[4] max tool executions
-- ARGV[5] global watermark ms  ARGV[6] allowed lateness ms  ARGV[7] inferred completion (1/0)
-- Span fact (an array, in this order): span id, parent id or "", parent remote 0/1, end ms
--   (0 = not ended), {reasons...}, execution array or false, session id or ""
--   (the service's fact dicts {i, p, r, e, f, x, s}, sent positionally: smaller, cheaper to code)
-- Returns {summary, state, old expiry, new expiry}: summary JSON {new, ds (spans dropped by the
--   limit), dx (executions dropped), n, late, root_end, pend=[...], dec=[...] (only when late),
--   sess=[...]}; state the trace's state JSON when it has pending or (late) decided expectations,
--   else ""; the state key's expiry (PEXPIRETIME, ms) before and after (-2: no state), which the
--   caller moves in the tenant's count of traces in state (TraceStateStore.note_expiry)
local st, raw = load_or_new(KEYS[1], KEYS[2])
local old_exp = expiry_of(KEYS[1], raw)
local facts = cjson.decode(ARGV[2])
local max_spans = tonumber(ARGV[3])
local max_execs = tonumber(ARGV[4])
local wm = tonumber(ARGV[5])
local lateness = tonumber(ARGV[6])
local inferred = ARGV[7] == '1'


local added = 0
local dropped_spans = 0
local dropped_execs = 0
local flagged = false
local root_end = 0
local new_sessions = {}
-- Was the trace already complete before this batch? Then any new span breaks the claim.
local was_complete = complete_by_claims(st, wm, lateness, inferred)
-- Whether two packed executions are one record (a replay). A record stored by an earlier version
-- of the service has its duration in whole microseconds (a number; -1 = not ended or ended
-- before it started) and keeps no delivered canary nor argument digest: against such a record
-- only what both versions keep is compared. Two current records are compared on everything
-- (a trailing element left off is its default: call id '', convention 0, no canary, no digest,
-- no recorder).
local function micros(d)
  if type(d) == 'number' then return d end
  if d == '' then return -1 end
  local ns = tonumber(d)
  if ns < 0 then return -1 end
  return math.floor(ns / 1000)
end
local trailing = {'', 0, '', '', ''}  -- call id, openinference, delivered canary, argument digest, recorder
-- Cut arguments as kept up to the cut: what follows the mark (hex runs of the part cut off) is
-- written by some versions of the service and not by others.
local CUT_MARK = '\226\128\166[cut; hex runs after the cut: '
local function up_to_cut(t)
  if type(t) ~= 'string' then return t end
  local at = string.find(t, CUT_MARK, 1, true)
  if at then return string.sub(t, 1, at - 1) end
  return t
end
local function same_record(a, b)
  local legacy = type(a[5]) == 'number' or type(b[5]) == 'number'
  -- Arguments the service cut: the digest of the whole arguments tells copies apart; the kept
  -- text may be written differently by another version (hex runs kept after the cut, or not).
  local digested = a[11] ~= nil and a[11] ~= '' and a[11] == b[11]
  for i = 1, 7 do
    if i == 5 then
      if legacy then
        if micros(a[5]) ~= micros(b[5]) then return false end
      elseif a[5] ~= b[5] then
        return false
      end
    elseif i == 7 and digested then
      -- compared by digest (element 11, below)
    elseif i == 7 and legacy and a[6] == 2 and b[6] == 2 then
      -- a record from before digests: the kept text up to the cut is all there is to compare
      if up_to_cut(a[7]) ~= up_to_cut(b[7]) then return false end
    elseif a[i] ~= b[i] then
      return false
    end
  end
  local last = legacy and 9 or 12
  for i = 8, last do
    local u, v = a[i], b[i]
    if u == nil then u = trailing[i - 7] end
    if v == nil then v = trailing[i - 7] end
    if u ~= v then return false end
  end
  return true
end
-- Executions by span id, built on the first repeated span id of the call (replays are common).
local by_id = nil
local function same_execution(id, x)
  if not by_id then
    by_id = {}
    for _, e in ipairs(st.x) do by_id[e[1]] = e end
  end
  local seen = by_id[id]
  if not x then return seen == nil end
  -- a span whose execution the limit dropped is not in st.x: its replay is no conflict (the
  -- limit already keeps the trace from ever being complete)
  if seen == nil then return st.r['limit_exceeded'] ~= nil end
  return same_record(seen, x)
end
for _, f in ipairs(facts) do
  local id, parent, remote, fend, reasons, x, sess = f[1], f[2], f[3], f[4], f[5], f[6], f[7]
  if st.s[id] then
    -- A replay repeats a span exactly. The same id with other tool evidence (another tool, other
    -- arguments, a tool span where there was none) is a conflict: whichever came first must not
    -- silently win (an agent could hide an execution behind a harmless span's id).
    if (x or #st.x > 0) and not same_execution(id, x) and not st.r['conflicting_evidence'] then
      st.r['conflicting_evidence'] = 1
      flagged = true
      if was_complete then st.l = 1 end
    end
  else
    if st.n >= max_spans then
      if not st.r['limit_exceeded'] then flagged = true end
      st.r['limit_exceeded'] = 1
      -- a span after completion, even one the limit drops, breaks the claim
      if was_complete then st.l = 1 end
      dropped_spans = dropped_spans + 1
    else
      if was_complete then st.l = 1 end
      st.s[id] = 1
      st.n = st.n + 1
      added = added + 1
      st.p[id] = nil
      if parent ~= '' and remote == 0 and not st.s[parent] then st.p[parent] = 1 end
      if parent == '' or remote == 1 then
        if fend > 0 then st.re = fend; root_end = fend end
      end
      for _, reason in ipairs(reasons) do st.r[reason] = 1 end
      if x then
        if #st.x >= max_execs then
          st.r['limit_exceeded'] = 1
          dropped_execs = dropped_execs + 1
        else
          table.insert(st.x, x)
          -- the index of this call, once built, knows it too: its replay later in the call is no conflict
          if by_id then by_id[id] = x end
        end
      end
      if sess ~= '' and not st.ss[sess] then st.ss[sess] = 1; table.insert(new_sessions, sess) end
    end
  end
end
if st.mc >= 0 and st.n > st.mc then st.l = 1 end

local encoded = dump_state(st)
local new_exp = old_exp
-- Write back when anything changed, including a limit flag set by spans that were all dropped.
if not raw then
  redis.call('SET', KEYS[1], encoded, 'PX', ARGV[1])
  new_exp = expiry_of(KEYS[1], true)
elseif added > 0 or flagged then
  -- An active trace keeps its evidence for state_ttl after its LAST change, not its first: a
  -- long trace must not lose its early spans mid-way (a later span would start it afresh).
  redis.call('SET', KEYS[1], encoded, 'PX', ARGV[1])
  new_exp = expiry_of(KEYS[1], true)
end
local pend = keys_of(st.pe)
local dec = {}
-- late: the trace's decided expectations are revised, and so are its sessions' (``ls``)
local late_sessions = {}
if st.l == 1 then dec = keys_of(st.de); late_sessions = keys_of(st.ss) end
-- the trace's sessions when it gained spans: their expectations are judged on it too (``ts``)
local touched = {}
if added > 0 then touched = keys_of(st.ss) end
local out_state = ''
if #pend > 0 or #dec > 0 then out_state = encoded end
-- The state goes back as its own reply element: not re-encoded (escaped) inside the summary.
return {cjson.encode({new = added, ds = dropped_spans, dx = dropped_execs, n = st.n, late = st.l,
  root_end = root_end, pend = pend, dec = dec, sess = new_sessions, ls = late_sessions, ts = touched}), out_state,
  old_exp, new_exp}
