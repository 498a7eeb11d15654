-- A session expectation decided on the session's completeness: no longer pending; decided (a
-- trace joining later revises it). All keys share the session's hash tag (one Cluster slot).
-- KEYS[1] the session's pending set  KEYS[2] its decided set  KEYS[3] its trace set
-- ARGV[1] expectation id  ARGV[2] ttl ms  ARGV[3] how many traces the evaluation saw
-- Returns 1 when the session has more traces now than the evaluation saw: one joined while it
--   was being decided, so the decision may rest on evidence it never read (re-judge it), else 0.
redis.call('SREM', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
if redis.call('SCARD', KEYS[3]) > tonumber(ARGV[3]) then return 1 end
return 0
