"""The Lua scripts of the Redis backend: every change to a stream's keys that must be atomic is
one script (on Redis Cluster all of a stream's keys share one slot, so one script may touch
them). ``connection.RedisConnection`` registers them per client."""

from __future__ import annotations

__all__ = ["APPEND", "CREATE", "INDEX", "RELEASE", "RENEW", "TRIM"]

# An own stream's append (``appender``): entries of a run, fenced by the lock token,
# idempotent: a retry of the same run (its reply was lost) finds its id as the tail's last run
# and changes nothing, even when the lease ran out meanwhile (the run was committed while the
# lock was held). KEYS: p, i, s, t, lock, tm.
APPEND = """
local cur = tonumber(redis.call('HGET', KEYS[4], 'end') or '0')
if cur == tonumber(ARGV[3]) and redis.call('HGET', KEYS[4], 'run') == ARGV[6] then
  return 'DUP'
end
if redis.call('GET', KEYS[5]) ~= ARGV[1] then
  return redis.error_reply('ROWTIME_LOCK the lock is not held by this writer')
end
if cur ~= tonumber(ARGV[2]) then
  return redis.error_reply('ROWTIME_OFFSET ' .. cur)
end
local runs = tonumber(ARGV[7])
for r = 0, runs - 1 do
  redis.call('ZADD', KEYS[3], ARGV[8 + 2 * r], ARGV[9 + 2 * r])
end
local i = 8 + 2 * runs
while i <= #ARGV do
  local id = redis.call('XADD', KEYS[1], '*', 'f', ARGV[i], 'n', ARGV[i + 1], 'a', ARGV[i + 2])
  redis.call('ZADD', KEYS[2], ARGV[i], ARGV[i] .. ':' .. ARGV[i + 1] .. ':' .. id .. ':' .. id)
  redis.call('HSET', KEYS[6], id, ARGV[i + 3])
  i = i + 4
end
redis.call('HSET', KEYS[4], 'end', ARGV[3], 'clock', ARGV[4], 'arrival', ARGV[5], 'run', ARGV[6])
return 'OK'
"""

# External streams: commit what one indexer read, if nobody indexed those entries meanwhile.
# ARGV: expected end, new end, clock, arrival, last id, bad count, n_members, members...,
# stats..., then pairs of (bad entry id, reason).
INDEX = """
local cur = tonumber(redis.call('HGET', KEYS[3], 'end') or '0')
if cur ~= tonumber(ARGV[1]) then return 0 end
local n = tonumber(ARGV[7])
for i = 1, n do
  local member = ARGV[7 + i]
  local first = string.match(member, '^(%d+):')
  redis.call('ZADD', KEYS[1], first, member)
  redis.call('ZADD', KEYS[2], first, ARGV[7 + n + i])
end
local j = 8 + 2 * n
while j <= #ARGV do
  redis.call('HSET', KEYS[4], ARGV[j], ARGV[j + 1])
  j = j + 2
end
local fields = {'end', ARGV[2], 'last_id', ARGV[5], 'bad', ARGV[6]}
if ARGV[3] ~= '' then
  table.insert(fields, 'clock'); table.insert(fields, ARGV[3])
  table.insert(fields, 'arrival'); table.insert(fields, ARGV[4])
end
redis.call('HSET', KEYS[3], unpack(fields))
return 1
"""

# Retention: drop the index, summaries and times of records below the new first kept offset,
# and their entries (XTRIM MINID: every entry below the first kept one's ID), if no other trim
# moved the first kept offset meanwhile. KEYS: trim, i, s, tm, p. ARGV: expected start, new
# start, new state (JSON), first kept entry ID, then the removed entries' IDs.
TRIM = """
local cur = redis.call('HGET', KEYS[1], 'start') or '0'
if cur ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'start', ARGV[2], 'state', ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[2])
for i = 5, #ARGV do redis.call('HDEL', KEYS[4], ARGV[i]) end
redis.call('XTRIM', KEYS[5], 'MINID', ARGV[4])
return 1
"""

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# A stream's creation (``create``): the whole meta hash at once, only if no one created it
# first; a reader never sees the ``meta`` field without ``format``. KEYS: meta; ARGV: field,
# value, field, value, ... with ``meta`` first. Returns 1 if this call created it.
CREATE = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
if #ARGV > 2 then redis.call('HSET', KEYS[1], unpack(ARGV, 3)) end
return 1
"""
