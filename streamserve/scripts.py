"""Lua scripts: every multi-step Redis write that must be atomic.

Each script names every key it touches in KEYS, so it runs on Redis Cluster
when those keys share a hash tag.
"""

from __future__ import annotations

ENQUEUE = """
-- Admit a request only if the deployment's queue has room (check and add are one step).
-- KEYS[1]  the deployment's request stream
-- ARGV[1]  max_queued_requests: entries waiting that no replica has read yet
-- ARGV[2]  the consumer group name
-- ARGV[3..] the request's field/value pairs
-- Returns the new entry id, or 0 when the queue is full.
local length = redis.call('XLEN', KEYS[1])
local limit = tonumber(ARGV[1])
if length >= limit then
  -- Entries stay in the stream until acknowledged, so subtract those already being worked on.
  local pending = redis.pcall('XPENDING', KEYS[1], ARGV[2])
  local in_flight = 0
  if type(pending) == 'table' and pending[1] then in_flight = tonumber(pending[1]) end
  if length - in_flight >= limit then return 0 end
end
return redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
"""

RENEW_LOCK = """
-- Extend a lock's expiry only if we still hold it.
-- KEYS[1] the lock key; ARGV[1] our holder id; ARGV[2] expiry in ms
-- Returns 1 if renewed, 0 if someone else holds it (or nobody does).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

RELEASE_LOCK = """
-- Delete a lock only if we hold it.
-- KEYS[1] the lock key; ARGV[1] our holder id
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
