"""Lua scripts: every multi-step Redis write that must be atomic.

Each script names every key it touches in KEYS, so it runs on Redis Cluster
when those keys share a hash tag. The exceptions reach keys that no caller could
know beforehand, all of the deployment's own hash slot, which a cluster lets a
script reach: SETTLE_RUN deletes the cache entries it evicts, and the routing of
multiplexing deployments (_ROUTE, ROUTED_STREAMS) reads the streams and models of
the replicas it finds listed.
"""

from __future__ import annotations

from streamserve.wire.tenants import DEFAULT_TENANT, LIMITED_SHOWN_MS

_PENDING_COUNT = """
-- "Queued" means the same for admission (ENQUEUE) and for status (QUEUE_DEPTH): entries of the request
-- stream that no replica has read yet, i.e. XLEN minus the group's pending count (read, not yet acknowledged).
-- Replicas XACK and XDEL an entry in one round trip, so finished entries count in neither figure.
local function pending_count(stream, group)
  local summary = redis.pcall('XPENDING', stream, group)
  if type(summary) == 'table' and summary[1] then return tonumber(summary[1]) end
  return 0  -- no stream or no group yet: nothing has been read
end
"""

_TENANT = (
    """
-- The limits of a request's tenant (wire/tenants.py). ``spec`` is '' (none) or
-- 'rate burst max_held token deadline_ms tenant'; ``bucket``, ``held`` and ``limited`` are the tenant's token bucket,
-- its held requests' tokens and the deployment's limited tenants (Keys.tenant_bucket, tenant_held, limited_tenants).
-- Returns a refusal ({'rate', ms until the next token} or {'tenant_full'}) or nil, and then a function that takes the
-- request's token from the bucket and counts it as held, to call once it is queued.
local function tenant_check(spec, bucket, held, limited)
  if spec == '' then return nil, nil end
  local rate, burst, max_held, token, deadline, tenant = string.match(spec, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
  rate, burst, max_held, deadline = tonumber(rate), tonumber(burst), tonumber(max_held), tonumber(deadline)
  local clock = redis.call('TIME')
  local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  local refused = nil
  if max_held > 0 then
    redis.call('ZREMRANGEBYSCORE', held, '-inf', now)  -- past their deadline: answered, or never will be by a run
    if redis.call('ZCARD', held) >= max_held then refused = {'tenant_full'} end
  end
  local tokens = burst
  if not refused and rate > 0 then
    local kept, at = unpack(redis.call('HMGET', bucket, 'tokens', 'at'))
    if kept then tokens = math.min(burst, tonumber(kept) + math.max(0, now - tonumber(at)) * rate / 1000) end
    if tokens < 1 then refused = {'rate', math.ceil((1 - tokens) * 1000 / rate)} end
  end
  if refused then
    redis.call('ZADD', limited, now, tenant)
    redis.call('ZREMRANGEBYSCORE', limited, '-inf', now - """
    + str(LIMITED_SHOWN_MS)
    + """)
    return refused, nil
  end
  return nil, function()
    if rate > 0 then
      redis.call('HSET', bucket, 'tokens', tostring(tokens - 1), 'at', now)
      redis.call('PEXPIRE', bucket, math.ceil(burst * 1000 / rate) + 1000)  -- by then it is full: as if new
    end
    if max_held > 0 then
      redis.call('ZADD', held, deadline, token)
      if redis.call('PTTL', held) < deadline - now + 1000 then redis.call('PEXPIRE', held, deadline - now + 1000) end
    end
  end
end
"""
)

_ROUTE = """
-- Where a request for a model goes (wire/models.py): ``route`` is '' (not routed) or 'capacity ttl_ms prefix model',
-- with the model's holders, the deployment's routed replicas and their room at KEYS[at], KEYS[at + 1], KEYS[at + 2].
-- The routed stream of the model's live holder with the fewest entries (queued and running), when that is fewer than
-- ``capacity`` (it is not saturated). When no live replica holds the model, a live replica that is not saturated is
-- given it (a holder until ttl_ms from now, as it will be once it loads it), so that the model's next requests follow
-- this one rather than make another replica load it too: the one with the most room for another model (its
-- max_models_per_replica less the models it holds or was given); with none, one that holds a model another replica
-- holds too (it unloads that one first: multiplexing._Models, so no model is left held by nobody); among those alike,
-- the least busy (fewest entries). Else nil (its holders all saturated, or every replica full of models only it
-- holds): the level's stream, where any replica takes it, loads the model and unloads its least recently used one.
-- A replica's routed stream, its models and their holders are named from the prefix (Keys.models_prefix): keys of
-- this deployment's hash slot that no caller could name beforehand.
local function holds_a_shared_model(prefix, models, now)
  for _, model in ipairs(models) do
    if redis.call('ZCOUNT', prefix .. 'holders:' .. model, '(' .. now, '+inf') > 1 then return true end
  end
  return false
end
local function route_to(route, at)
  if route == '' then return nil end
  local capacity, ttl, prefix, model = string.match(route, '^(%d+) (%d+) (%S+) (%S+)$')
  capacity = tonumber(capacity)
  local clock = redis.call('TIME')
  local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  local holders, replicas, room = KEYS[at], KEYS[at + 1], KEYS[at + 2]
  redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
  local best, fewest, live_holders = nil, capacity, 0
  for _, replica in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
    -- A holder only while it is a live routed replica: one whose queue the sweep gave back (it died, or left)
    -- may still be listed until its hold lapses, and a request routed to it would wait where nobody reads.
    if tonumber(redis.call('ZSCORE', replicas, replica) or 0) > now then
      live_holders = live_holders + 1
      local length = redis.call('XLEN', prefix .. 'to:' .. replica)
      if length < fewest then best, fewest = replica, length end
    end
  end
  if best then return prefix .. 'to:' .. best, 'to:' .. best .. '/' end
  if live_holders > 0 then return nil end
  -- Its rank: its room when it has some (1 or more), 0 when it holds a model another replica holds too.
  local best_rank = -1
  for _, replica in ipairs(redis.call('ZRANGEBYSCORE', replicas, '(' .. now, '+inf')) do
    local length = redis.call('XLEN', prefix .. 'to:' .. replica)
    if length < capacity then
      local of = prefix .. 'of:' .. replica
      redis.call('ZREMRANGEBYSCORE', of, '-inf', now)
      local models = redis.call('ZRANGE', of, 0, -1)
      local rank = tonumber(redis.call('HGET', room, replica) or 0) - #models
      if rank < 1 then
        rank = (best_rank <= 0 and holds_a_shared_model(prefix, models, now)) and 0 or -1
      end
      if rank >= 0 and (rank > best_rank or (rank == best_rank and length < fewest)) then
        best, best_rank, fewest = replica, rank, length
      end
    end
  end
  if not best then return nil end
  local expiry = now + tonumber(ttl)
  redis.call('ZADD', holders, expiry, best)
  redis.call('PEXPIRE', holders, ttl)
  redis.call('ZADD', prefix .. 'of:' .. best, expiry, model)
  return prefix .. 'to:' .. best, 'to:' .. best .. '/'
end
"""

_ADMIT = (
    _TENANT
    + _ROUTE
    + """
-- Add the request (fields ARGV[first..]) to KEYS[1] if its tenant's limits (``spec``, its keys from KEYS[at]) and the
-- queue have room, or to a holder of its model (``route``, its key after the tenant's: route_to); the new entry id
-- (a routed stream's prefixed by its lane), 0 when the queue is full, or the tenant's refusal (tenant_check).
local function admit(limit, group, first, spec, at, route)
  local refused, take = tenant_check(spec, KEYS[at], KEYS[at + 1], KEYS[at + 2])
  if refused then return refused end
  local model, lane = route_to(route or '', spec == '' and at or at + 3)
  -- NOMKSTREAM: a routed stream that is gone (given back) is not made anew, without the group its replica reads
  -- with; the request goes to the level's stream instead.
  local id = model and redis.call('XADD', model, 'NOMKSTREAM', '*', unpack(ARGV, first))
  if id then
    if take then take() end
    return lane .. id
  end
  local length = redis.call('XLEN', KEYS[1])
  -- XLEN counts the entries being worked on too: only when it alone reaches the limit is XPENDING needed.
  if length >= limit and length - pending_count(KEYS[1], group) >= limit then return 0 end
  local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, first))
  if take then take() end
  return id
end
"""
)

ENQUEUE = (
    """
-- Admit a request only if the deployment's queue (and its tenant's limits) have room (check and add are one step).
-- KEYS[1]  the request stream of its priority level
-- KEYS[2..4] with a tenant spec: its tenant's bucket, held tokens, and the deployment's limited tenants
-- then, with a route: its model's holders, the deployment's routed replicas and their room (_ROUTE)
-- ARGV[1]  max_queued_requests: entries waiting that no replica has read yet
-- ARGV[2]  the consumer group name
-- ARGV[3]  the tenant spec, '' for none (_TENANT)
-- ARGV[4]  the route, '' for none (_ROUTE)
-- ARGV[5..] the request's field/value pairs
-- Returns the new entry id (a routed stream's with its lane: 'to:<replica id>/<entry id>'), 0 when the queue is full,
-- or the tenant's refusal.
"""
    + _PENDING_COUNT
    + _ADMIT
    + """
return admit(tonumber(ARGV[1]), ARGV[2], 5, ARGV[3], 2, ARGV[4])
"""
)

ENQUEUE_AGAIN = (
    """
-- ENQUEUE sent again after its connection was lost before the answer came: the first sending may have been
-- added (and even run) already. Add the request only if neither the request stream holds it (queued or being
-- run: an entry stays until its replica acknowledges it) nor the caller's reply stream holds its reply (a
-- replica adds the reply before it deletes the entry). Scans both: sent only on this rare path. An entry is this
-- request's by its request id and its call tag together: a caller may give two calls one request id
-- (X-Request-ID), and the other call's entry or reply is not this one's.
-- KEYS[1]  the request stream of its priority level
-- KEYS[2..4] with a tenant spec: as for ENQUEUE
-- then, with a route: as for ENQUEUE (the holders' routed streams are searched too)
-- then the caller's reply stream (absent on a Redis Cluster, where it lives in another slot)
-- ARGV[1]  max_queued_requests; -1: only look (the caller left: what is found is cancelled, nothing is added)
-- ARGV[2]  the consumer group name
-- ARGV[3]  the request id
-- ARGV[4]  the tenant spec, '' for none
-- ARGV[5]  the route, '' for none
-- ARGV[6..] the request's field/value pairs
-- Returns the id of the entry found or added (as ENQUEUE), 'answered' when its reply is there already (it ran, and
-- has no entry any more), false when only looking found nothing, 0 when the queue is full, or the tenant's refusal.
"""
    + _PENDING_COUNT
    + _ADMIT
    + """
local function field_of(fields, first, name)
  for j = first, #fields, 2 do
    if fields[j] == name then return fields[j + 1] end
  end
  return ''
end
local tag = field_of(ARGV, 6, 'tag')
local function find(stream, request_id)
  local from = '-'
  while true do
    local batch = redis.call('XRANGE', stream, from, '+', 'COUNT', 200)
    for _, entry in ipairs(batch) do
      local fields = entry[2]
      if field_of(fields, 1, 'id') == request_id and field_of(fields, 1, 'tag') == tag then return entry[1] end
    end
    if #batch < 200 then return false end
    from = '(' .. batch[#batch][1]
  end
end
local holders_at = ARGV[4] ~= '' and 5 or 2
local replies = KEYS[ARGV[5] ~= '' and holders_at + 3 or holders_at]
local found = find(KEYS[1], ARGV[3])
if not found and ARGV[5] ~= '' then
  local prefix = string.match(ARGV[5], '^%d+ %d+ (%S+) ')
  for _, replica in ipairs(redis.call('ZRANGE', KEYS[holders_at], 0, -1)) do
    found = find(prefix .. 'to:' .. replica, ARGV[3])
    if found then
      found = 'to:' .. replica .. '/' .. found
      break
    end
  end
end
if found then return found end
if replies and find(replies, ARGV[3]) then return 'answered' end
if tonumber(ARGV[1]) < 0 then return false end
return admit(tonumber(ARGV[1]), ARGV[2], 6, ARGV[4], 2, ARGV[5])
"""
)

ENQUEUE_SHARED = (
    """
-- Admit a request whose run may be shared (wire/shared_runs.py: an idempotency key, or a response cache), or have it
-- join that run or take its stored reply. Looking and adding are one step, so callers racing with one key or one
-- cached request (through two gateways, say) run it once.
-- KEYS[1]  the deployment's request stream
-- KEYS[2]  the run's record (hash)
-- KEYS[3]  the run's waiters (list)
-- KEYS[4]  the deployment's metrics hash
-- KEYS[5..7] with a tenant spec: as ENQUEUE's KEYS[2..4]
-- ARGV[1]  max_queued_requests
-- ARGV[2]  the consumer group name
-- ARGV[3]  the digest a record found must have (an idempotency key's), or '' (a cache entry is named by its digest)
-- ARGV[4]  this call's run token
-- ARGV[5]  how long a new record is kept while its request waits or runs (ms)
-- ARGV[6]  this caller as a waiter (JSON [reply_to, tag, request id]), or '' when it waits for no reply
-- ARGV[7]  the request id
-- ARGV[8]  '1' to run anew whatever the record holds (a cache refresh: the new reply replaces the kept one)
-- ARGV[9]  the metrics field that results are counted under, less the result ('' to count nothing)
-- ARGV[10] the tenant spec, '' for none: a request that would run is checked (one answered or waiting is not)
-- ARGV[11..] the request's field/value pairs
-- Returns {'queued', entry id}, {'full'}, {'mismatch'}, {'waiting', the id of the request that runs}, the tenant's
-- refusal, or {'stored', status, body, error_type, error_message, replica, too_large, ms the record has left, the id
-- of the request that ran}.
"""
    + _PENDING_COUNT
    + _ADMIT
    + """
local function count(result)
  -- pcall: a Redis out of memory refuses the count, and must not refuse the hit with it (a hit needs no memory)
  if ARGV[9] ~= '' then redis.pcall('HINCRBY', KEYS[4], ARGV[9] .. result, 1) end
end
local state, digest, run, entry, runs_for = unpack(
  redis.call('HMGET', KEYS[2], 'state', 'digest', 'run', 'entry', 'request_id'))
if state and run == ARGV[4] then return {'queued', entry} end  -- this call's own enqueue, sent again
if state and ARGV[8] ~= '1' then
  if ARGV[3] ~= '' and digest ~= ARGV[3] then return {'mismatch'} end
  if state == 'done' then
    count('hit')
    local stored = redis.call('HMGET', KEYS[2], 'status', 'body', 'error_type', 'error_message', 'replica', 'too_large')
    local found = {'stored'}
    for i = 1, 6 do found[i + 1] = stored[i] or '' end
    found[8] = redis.call('PTTL', KEYS[2])
    found[9] = runs_for or ''
    return found
  end
  if ARGV[6] ~= '' then
    redis.call('RPUSH', KEYS[3], ARGV[6])
    redis.call('PEXPIRE', KEYS[3], math.max(redis.call('PTTL', KEYS[2]), 1000))
    redis.call('HSET', KEYS[2], 'joined', '1')  -- SETTLE_RUN reads the waiters only of a run that has some
  end
  count('coalesced')
  return {'waiting', runs_for or ''}
end
local id = admit(tonumber(ARGV[1]), ARGV[2], 11, ARGV[10], 5)
if id == 0 then return {'full'} end
if type(id) == 'table' then return id end
count('miss')
if state then redis.call('DEL', KEYS[2]) end  -- a refresh: the new run replaces the kept reply
redis.call('HSET', KEYS[2], 'state', 'running', 'digest', ARGV[3], 'run', ARGV[4], 'request_id', ARGV[7], 'entry', id)
-- (A refresh of a run still on its way: its waiters, who joined the run replaced, get this one's reply.)
if state and redis.call('EXISTS', KEYS[3]) == 1 then redis.call('HSET', KEYS[2], 'joined', '1') end
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return {'queued', id}
"""
)

SETTLE_RUN = """
-- End a shared run (wire/shared_runs.py): store its reply for later requests, or delete its record so that the next
-- request runs. Only the run the record names is settled, and only once: a record that lapsed, or that a cache
-- refresh took over, is another run's.
-- KEYS[1]  the run's record (hash)
-- KEYS[2]  the run's waiters (list)
-- KEYS[3]  a response cache's index (sorted set: digest -> when kept), absent for an idempotency key
-- ARGV[1]  the run token
-- ARGV[2]  'store' or 'release'
-- ARGV[3]  how long a stored reply is kept (ms)
-- ARGV[4]  a cache's max_entries (0: no index)
-- ARGV[5]  a cache entry's digest (its index member)
-- ARGV[6]  a cache entry's key less its digest (Keys.cache_entry): evicted entries are deleted by it, keys of this
--          deployment's hash slot that no caller could name in KEYS beforehand
-- ARGV[7]  now, epoch ms
-- ARGV[8..] the reply's field/value pairs to store
-- Returns the waiters that joined the run, for the caller of this script to answer.
local run, joined, state = unpack(redis.call('HMGET', KEYS[1], 'run', 'joined', 'state'))
if run ~= ARGV[1] then return {} end
-- Settled already: the first end stands. A replica cut off from Redis mid-run is written off and its request run
-- again elsewhere; its own late reply, sent once it is back, must not replace the reply its retries were given.
if state == 'done' then return {} end
local waiting = {}
if joined then  -- (most runs have no waiters: their list is not read)
  waiting = redis.call('LRANGE', KEYS[2], 0, -1)
end
-- The first write, before the reply's: a script that has written goes on past maxmemory (Redis's rule for scripts
-- without flags), and a run's reply must be kept once it ran: a record left running makes its retries wait for it
-- to lapse, then run the handler again.
redis.call('DEL', KEYS[2])
if ARGV[2] == 'release' then
  redis.call('DEL', KEYS[1])
  return waiting
end
redis.call('HSET', KEYS[1], 'state', 'done', unpack(ARGV, 8))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local most = tonumber(ARGV[4])
if KEYS[3] and most > 0 then
  local now = tonumber(ARGV[7])
  -- After every entry kept so far, even one kept in the same millisecond (or by a replica whose clock is ahead):
  -- eviction goes oldest first, never by the digests' order among equal scores.
  local newest = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  local score = now
  if newest[2] and tonumber(newest[2]) >= now then score = tonumber(newest[2]) + 0.001 end
  redis.call('ZADD', KEYS[3], score, ARGV[5])
  -- Older than ttl_s: lapsed by themselves, or kept under a longer ttl_s before a deploy lowered it (then never
  -- served again, as the config is in their digest, yet alive for their old ttl: deleted here, or max_entries would
  -- no longer bound what the cache holds).
  local lapsed = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now - tonumber(ARGV[3])))
  for _, digest in ipairs(lapsed) do redis.call('DEL', ARGV[6] .. digest) end
  if #lapsed > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now - tonumber(ARGV[3]))) end
  local excess = redis.call('ZCARD', KEYS[3]) - most
  if excess > 0 then
    local oldest = redis.call('ZPOPMIN', KEYS[3], excess)
    for i = 1, #oldest, 2 do redis.call('DEL', ARGV[6] .. oldest[i]) end
  end
end
return waiting
"""

KEEP_RUN = """
-- Keep a shared run's record while its handler runs on past its request's deadline (a sync handler, which nothing can
-- stop): a record that lapsed let a retry run the handler again, and the first run's reply went unkept.
-- KEYS[1]  the run's record (hash)
-- KEYS[2]  the run's waiters (list), kept as long: the retries that joined it are answered when it ends
-- ARGV[1]  the run token
-- ARGV[2]  how long from now they are kept at least (ms)
-- Returns 1 when the record is this run's and still running, else 0.
local run, state = unpack(redis.call('HMGET', KEYS[1], 'run', 'state'))
if run ~= ARGV[1] or state ~= 'running' then return 0 end
for _, key in ipairs(KEYS) do
  local left = redis.call('PTTL', key)
  if left ~= -2 and left < tonumber(ARGV[2]) then redis.call('PEXPIRE', key, ARGV[2]) end
end
return 1
"""

QUEUE_DEPTH = (
    """
-- One consistent reading of request streams' figures (status shows queued = length - pending).
-- KEYS     the deployment's request streams (one per priority level)
-- ARGV[1]  the consumer group name
-- Returns {length, pending} for each stream in turn, flat.
"""
    + _PENDING_COUNT
    + """
local figures = {}
for _, stream in ipairs(KEYS) do
  figures[#figures + 1] = redis.call('XLEN', stream)
  figures[#figures + 1] = pending_count(stream, ARGV[1])
end
return figures
"""
)

ADMIT_JOB = """
-- Count an asynchronous job against its deployment's bound, if the deployment has room (check and count are one
-- step, so concurrent submitters cannot overshoot it). The caller queues the job on RQ only once it is counted.
-- KEYS[1]  the deployment's accepted-jobs sorted set (job id -> when accepted, epoch ms)
-- ARGV[1]  max_queued_jobs: jobs accepted and not finished
-- ARGV[2]  the job id
-- ARGV[3]  now, epoch ms
-- Returns 1 when the job is counted, 0 when the deployment already has max_queued_jobs.
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
return 1
"""

REQUEUE_STRANDED_JOB = """
-- Put a job that a worker took and never started back at the front of its RQ queue (its worker died between the
-- two): only if it is still in the queue's intermediate list, so that two sweeps cannot both queue it again.
-- KEYS[1]  the queue's intermediate list (where RQ moves the id of a job a worker takes, until it starts it)
-- KEYS[2]  the queue (RQ takes job ids from its front)
-- ARGV[1]  the job id
-- Returns 1 when queued again, 0 when it had left the intermediate list.
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('LPUSH', KEYS[2], ARGV[1])
return 1
"""

RENEW_LOCK = """
-- Extend a lock's expiry if we still hold it; take it again if it expired (Redis was away) and nobody took it.
-- The extension is a SET, which a Redis out of memory refuses; then a PEXPIRE, which it takes, extends it: so the
-- holder learns on every renewal whether Redis takes writes, at no cost of its own.
-- KEYS[1] the lock key; ARGV[1] our holder id; ARGV[2] expiry in ms
-- Returns {1 if we hold it now else 0, 1 if Redis refused the SET for lack of memory else 0}.
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  local set = redis.pcall('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if type(set) == 'table' and set.err then
    if not string.find(set.err, 'OOM', 1, true) then return redis.error_reply(set.err) end
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, 1}
  end
  return {1, 0}
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, 0}
end
return {0, 0}
"""

DELETE_IF_VALUE = """
-- Delete a key only if it still holds the value we read (a lock we hold, a record nobody replaced since).
-- KEYS[1] the key; ARGV[1] that value
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

REQUEUE = (
    """
-- Give pending entries back to the queue as new entries at its tail: those a dead replica held
-- (counting one more attempt, and going to the dead-letter stream once they reach
-- max_delivery_attempts), or those a live replica hands back unrun (counting nothing).
-- One entry is moved atomically.
-- KEYS[1]  the deployment's request stream
-- KEYS[2]  the deployment's dead-letter stream (capped at ARGV[4] entries, approximately)
-- KEYS[3]  the deployment's cancelled-entries sorted set: an entry in it was cancelled, and is dropped, not moved
-- KEYS[4]  the deployment's untold dead letters (list): each dead-lettered entry's nine returned fields, kept until
--          the scheduler has told its caller (and freed its run)
-- KEYS[5]  where moved entries go, when not back to KEYS[1]: a model's stream gives them to its deployment's
-- ARGV[1]  the consumer group name
-- ARGV[2]  max_delivery_attempts
-- ARGV[3]  why (stored with a dead-lettered entry)
-- ARGV[4]  dead-letter stream cap
-- ARGV[5]  attempts to add: 1 when the replica died holding them, 0 when handed back
-- ARGV[6]  how KEYS[3] names this stream's entries: the prefix of an entry id (wire/priorities.py, entry_ref)
-- ARGV[7]  the tenants' held sets' key less the tenant (Keys.tenant_held with ''): an entry dropped or dead-lettered
--          no longer counts against its tenant's max_queued (keys of this deployment's hash slot)
-- ARGV[8..] ids of pending entries to move
-- Returns {request_id, reply_to, deliveries, tag, idem, cache, run, tenant, reason, ...} for every entry sent to the
-- dead-letter stream (tenant '' for the default tenant).
local dead = {}
local into = KEYS[5] or KEYS[1]
local max_deliveries = tonumber(ARGV[2])
local increment = tonumber(ARGV[5])
for i = 8, #ARGV do
  local id = ARGV[i]
  local entries = redis.call('XRANGE', KEYS[1], id, id)
  -- Cancelled while it ran: nobody waits for it, it must not run again.
  local cancelled = redis.call('ZREM', KEYS[3], ARGV[6] .. id) == 1
  if #entries > 0 then
    local fields = entries[1][2]
    local kept, attempts, request_id, reply_to, tag, idem, cache, run, tenant = {}, 0, '', '', '', '', '', '', ''
    local held = ''
    for j = 1, #fields, 2 do
      local name, value = fields[j], fields[j + 1]
      if name == 'attempts' then
        attempts = tonumber(value) or 0
      else
        kept[#kept + 1] = name
        kept[#kept + 1] = value
      end
      if name == 'id' then request_id = value elseif name == 'reply_to' then reply_to = value end
      if name == 'tag' then tag = value elseif name == 'idem' then idem = value end
      if name == 'cache' then cache = value elseif name == 'run' then run = value end
      if name == 'tenant' then tenant = value elseif name == 'held' then held = value end
    end
    local deliveries = attempts + increment
    if deliveries > 0 then  -- (one never charged goes back as it came: not a suspect, which a replica runs alone)
      kept[#kept + 1] = 'attempts'
      kept[#kept + 1] = tostring(deliveries)
    end
    local buried = not cancelled and increment > 0 and deliveries >= max_deliveries
    if buried then
      kept[#kept + 1] = 'reason'
      kept[#kept + 1] = ARGV[3]
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', unpack(kept))
      local letter = {request_id, reply_to, tostring(deliveries), tag, idem, cache, run, tenant, ARGV[3]}
      redis.call('RPUSH', KEYS[4], unpack(letter))
      for _, field in ipairs(letter) do dead[#dead + 1] = field end
    elseif not cancelled then
      redis.call('XADD', into, '*', unpack(kept))
    end
    if (cancelled or buried) and held ~= '' then  -- it is neither queued nor running any more
      redis.call('ZREM', ARGV[7] .. (tenant ~= '' and tenant or '"""
    + DEFAULT_TENANT
    + """'), held)
    end
  end
  redis.call('XACK', KEYS[1], ARGV[1], id)
  redis.call('XDEL', KEYS[1], id)
end
return dead
"""
)

CANCEL = """
-- Cancel one request wherever it is now: still queued (no replica has read it), it is deleted and never runs;
-- held by a replica, it is marked cancelled (so that the reclaimer drops it should that replica die) and the
-- caller tells that replica on its control stream, unless it is a shared run (ARGV[7]), which runs on unmarked;
-- finished (acknowledged and deleted), nothing happens.
-- KEYS[1]  the request stream of the request's priority
-- KEYS[2]  the deployment's cancelled-entries sorted set (entry ref -> until when its mark is kept, epoch ms); it
--          lapses with the last of its marks
-- KEYS[3]  the deployment's metrics hash
-- ARGV[1]  the consumer group name
-- ARGV[2]  the request's entry id
-- ARGV[3]  now, epoch ms: marks kept until before it are trimmed
-- ARGV[4]  until when this request's mark is kept, epoch ms (its deadline and a margin)
-- ARGV[5]  the metrics field that counts requests cancelled while queued
-- ARGV[6]  the entry's ref (wire/priorities.py: its id, prefixed by its level unless normal)
-- ARGV[7]  '1' for a shared run (wire/shared_runs.py): cancelled only while queued
-- Returns {'queued'}, {'running', replica id}, {'runs_on', replica id} (a shared run) or {'finished'}.
local held = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if type(held) == 'table' and held[1] then
  if ARGV[7] == '1' then return {'runs_on', held[1][2]} end
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[6])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[3])
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIREAT', KEYS[2], last[2]) end  -- (none left: this mark had lapsed already)
  return {'running', held[1][2]}
end
if redis.call('XDEL', KEYS[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
  return {'queued'}
end
return {'finished'}
"""

TAKE = """
-- A replica's read when requests may be queued at several priority levels (wire/priorities.py): up to ARGV[3]
-- entries, from the streams in the order given, each read to its end before the next. Never blocks (a script
-- cannot): the replica blocks in a plain XREADGROUP when this finds nothing.
-- KEYS     the deployment's request streams, in this turn's order
-- ARGV[1]  the consumer group name
-- ARGV[2]  the consumer (replica id)
-- ARGV[3]  how many entries at most
-- Returns what XREADGROUP would: {{stream, {{id, fields}, ...}}, ...}, streams with nothing left out.
local taken = {}
local left = tonumber(ARGV[3])
for _, stream in ipairs(KEYS) do
  if left <= 0 then break end
  local read = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', left, 'STREAMS', stream, '>')
  if type(read) == 'table' and read[1] then
    taken[#taken + 1] = read[1]
    left = left - #read[1][2]
  elseif type(read) == 'table' and read.err then
    return redis.error_reply(read.err)  -- NOGROUP: the replica makes the group again
  end
end
return taken
"""

TENANT_LABELS = """
-- Which tenants get a label of their own in a deployment's metrics: those that have one, and new ones while fewer
-- than the cap have (wire/tenants.py); the flusher counts the rest as "_other".
-- KEYS[1]  the deployment's labelled tenants (set)
-- ARGV[1]  the cap
-- ARGV[2..] tenants counted in this flush
-- Returns the tenants of ARGV[2..] that have a label.
local kept = {}
for i = 2, #ARGV do
  local tenant = ARGV[i]
  local labelled = redis.call('SISMEMBER', KEYS[1], tenant) == 1
  if not labelled and redis.call('SCARD', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('SADD', KEYS[1], tenant)
    labelled = true
  end
  if labelled then kept[#kept + 1] = tenant end
end
return kept
"""

_NOW_MS = """
local function now_ms()
  local clock = redis.call('TIME')
  return tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
end
"""

HOLD_MODEL = (
    """
-- A replica of a multiplexing deployment is live, and holds some models (wire/models.py): make its routed stream and
-- group if need be, say how many models it keeps, and count it among the holders of each model it holds until ARGV[3]
-- ms from now (Redis's clock, as ENQUEUE's route reads it). Sent when the replica starts, begins to load a model, and
-- with each heartbeat, so a stream given back meanwhile (the replica was frozen past its time) is made again.
-- KEYS[1]  the replica's routed stream
-- KEYS[2]  the deployment's routed replicas (sorted set: replica -> until when)
-- KEYS[3]  the models the replica holds (sorted set: model -> until when)
-- KEYS[4]  the deployment's replicas' room (hash: replica -> max_models_per_replica)
-- KEYS[5..] the holders of each model it holds (sorted sets: replica -> until when)
-- ARGV[1]  the consumer group name
-- ARGV[2]  the replica id
-- ARGV[3]  for how long (ms): a beat less than the heartbeat timeout
-- ARGV[4]  its max_models_per_replica
-- ARGV[5..] the models it holds, in KEYS[5..]'s order
-- Returns those of its models that another live replica holds too (the replica unloads these first: ModelHolder).
"""
    + _NOW_MS
    + """
local made = redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
if type(made) == 'table' and made.err and not string.find(made.err, 'BUSYGROUP', 1, true) then
  return redis.error_reply(made.err)
end
local ttl, now = tonumber(ARGV[3]), now_ms()
local expiry = now + ttl
redis.call('ZADD', KEYS[2], expiry, ARGV[2])
redis.call('HSET', KEYS[4], ARGV[2], ARGV[4])
local shared = {}
for i = 5, #KEYS do
  redis.call('ZADD', KEYS[i], expiry, ARGV[2])
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
  redis.call('ZADD', KEYS[3], expiry, ARGV[i])
  if redis.call('ZCOUNT', KEYS[i], '(' .. now, '+inf') > 1 then shared[#shared + 1] = ARGV[i] end
end
if redis.call('PTTL', KEYS[3]) < ttl then redis.call('PEXPIRE', KEYS[3], ttl) end
return shared
"""
)

ROUTED_STREAMS = (
    """
-- A multiplexing deployment's routed streams (wire/models.py), looked after and summed up. The stream of a replica
-- that left (ARGV[4] names one leaving now: it is no longer a holder of the models KEYS[4..]) or whose time has
-- passed (it died) gives its queued entries back to the deployment's stream, and is deleted once nothing in it is
-- pending either: so no request waits for a replica that is gone. Entries pending for a dead replica are the
-- reclaimer's (they count an attempt); for a leaving one, it is running them.
-- A replica sends this as it leaves; the scheduler every tick (which is how a dead replica's queue is given back once
-- its time has passed), keeping KEDA's count too; status only reads. The routed streams' keys are made here from their
-- prefix: keys of this deployment's hash slot that no caller could name beforehand.
-- KEYS[1]  the deployment's routed replicas (sorted set: replica -> until when; 0 once it left)
-- KEYS[2]  the deployment's (normal-priority) request stream
-- KEYS[3]  a stream kept exactly as long as the routed streams together (up to ARGV[5]), for KEDA
--          (Keys.model_backlog)
-- KEYS[4]  the deployment's replicas' room (hash)
-- KEYS[5..] the holders of the models the leaving replica holds
-- ARGV[1]  the consumer group name
-- ARGV[2]  what the deployment's multiplexing keys start with (Keys.models_prefix)
-- ARGV[3]  '1' to give back (and delete) the streams of replicas gone, '0' only to read the figures
-- ARGV[4]  the replica leaving now, or ''
-- ARGV[5]  KEYS[3]'s cap; 0: KEYS[3] is left as it is
-- ARGV[6]  '1' to find the last entry read from the routed streams (the scheduler's autoscaling), '0' not to
-- Returns {length, pending, entries given back} summed over the routed streams, and the id of the last entry a replica
-- read from any of them ('0-0' for none, or when ARGV[6] is '0').
"""
    + _NOW_MS
    + _PENDING_COUNT
    + """
local function last_delivered(stream)
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if type(groups) ~= 'table' or groups.err then return nil end
  for _, group in ipairs(groups) do
    local fields = {}
    for i = 1, #group, 2 do fields[group[i]] = group[i + 1] end
    if fields['name'] == ARGV[1] then return fields['last-delivered-id'] end
  end
  return nil
end
local function give_back(replica, stream)
  local moved, last = 0, last_delivered(stream)
  while last do
    local batch = redis.call('XRANGE', stream, '(' .. last, '+', 'COUNT', 200)
    for _, entry in ipairs(batch) do
      redis.call('XADD', KEYS[2], '*', unpack(entry[2]))
      redis.call('XDEL', stream, entry[1])
      moved = moved + 1
    end
    if #batch < 200 then break end
    last = batch[#batch][1]
  end
  redis.call('DEL', ARGV[2] .. 'of:' .. replica)
  redis.call('HDEL', KEYS[4], replica)
  if redis.call('XLEN', stream) == 0 then
    redis.call('DEL', stream)
    redis.call('ZREM', KEYS[1], replica)
  end
  return moved
end
if ARGV[4] ~= '' then
  for i = 5, #KEYS do redis.call('ZREM', KEYS[i], ARGV[4]) end
  redis.call('ZADD', KEYS[1], 0, ARGV[4])
end
local now = now_ms()
local listed = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local length, pending, moved = 0, 0, 0
local last, last_ms, last_seq = '0-0', 0, 0
for i = 1, #listed, 2 do
  local replica, expiry = listed[i], tonumber(listed[i + 1])
  local stream = ARGV[2] .. 'to:' .. replica
  if ARGV[6] == '1' then
    local id = last_delivered(stream) or ''
    local ms, seq = string.match(id, '^(%d+)-(%d+)$')
    ms, seq = tonumber(ms), tonumber(seq)
    if ms and (ms > last_ms or (ms == last_ms and seq > last_seq)) then last, last_ms, last_seq = id, ms, seq end
  end
  if ARGV[3] == '1' and expiry <= now then moved = moved + give_back(replica, stream) end
  length = length + redis.call('XLEN', stream)
  pending = pending + pending_count(stream, ARGV[1])
end
if tonumber(ARGV[5]) > 0 then
  local want = math.min(length, tonumber(ARGV[5]))
  local have = redis.call('XLEN', KEYS[3])
  if have > want then redis.call('XTRIM', KEYS[3], 'MAXLEN', want) end
  for _ = have + 1, want do redis.call('XADD', KEYS[3], '*', 'n', '1') end
end
return {length, pending, moved, last}
"""
)
