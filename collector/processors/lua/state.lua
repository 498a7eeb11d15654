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
local function dump_state(st)
  local out = {}
  for k, v in pairs(st) do
    if type(v) ~= 'table' or next(v) ~= nil then out[k] = v end
  end
  return cjson.encode(out)
end
local function keys_of(t)
  local out = {}
  for k, _ in pairs(t or {}) do table.insert(out, k) end
  return out
end
