"""Lua scripts of the Redis prefix index.  Each runs atomically in one round trip.

Key layout, all under ``P = kvemu:<cluster>:`` (hashes as 16 hex digits):

    P held:<slot>      SET of hashes the replica in that slot holds: the truth
    P b:<hash>         SET of slot numbers that may hold the block (small integers, so
                       Redis keeps it a compact intset): a superset of the truth, used
                       to find candidates; stale members wait for gc()
    P r:<replica_id>   HASH epoch, last_seq, slot, synced and per-replica counters
    P replicas         HASH replica_id -> slot       P slots   HASH slot -> replica_id
    P free             LIST of free slots            P next_slot  counter
    P entries          (hash, replica) pairs stored, garbage included: the bound
    P garbage          how many of those belong to retired held sets
    P gcq              LIST of "slot:n" retired held sets awaiting unlinking
    P gc:<slot>:<n>    a retired held set (n from the P gcseq counter)
    P stats            HASH cluster-wide counters

Lookup: candidates are the slots in ``b:<first hash>``; each candidate's prefix length
comes from SMISMEMBER on its held set over doubling chunks of the prompt, stopping at
the first miss.
So a lookup costs about 2 + candidates commands inside one script, whatever the number
of replicas, and it reads only ``held:`` sets for its answer, so stale ``b:`` members can
never produce a false hit.

Clearing a replica (restart, gap, ``cleared`` event, ``clear_replica``) renames its held
set onto the GC queue: O(1), atomic, and the replica's view is empty at once.  gc()
unlinks the retired ``b:`` members a bounded chunk at a time in later calls, so no call
walks the keyspace or a whole replica.  Keys are built inside the scripts, so this needs
a standalone Redis (or one Cluster shard), not Redis Cluster.
"""

from __future__ import annotations

MAX_SLOTS = 4096
LOOKUP_FIRST_CHUNK = 16
LOOKUP_MAX_CHUNK = 256

_PRELUDE = """
local P = ARGV[1]
-- Lua counts in doubles; %d formatting keeps integers from turning into 1e+15 strings.
local function fmt(x) return string.format('%d', x) end

-- Unlink up to `budget` entries of retired held sets; returns how many.
local function gc(budget)
  local done, q = 0, P .. 'gcq'
  while done < budget do
    local item = redis.call('LINDEX', q, 0)
    if not item then break end
    local slot = string.sub(item, 1, string.find(item, ':', 1, true) - 1)
    local gkey, held = P .. 'gc:' .. item, P .. 'held:' .. slot
    for _, h in ipairs(redis.call('SPOP', gkey, budget - done)) do
      -- The slot's current occupant may hold the block again: the member is then its own.
      if redis.call('SISMEMBER', held, h) == 0 then redis.call('SREM', P .. 'b:' .. h, slot) end
      done = done + 1
    end
    if redis.call('EXISTS', gkey) == 0 then redis.call('LPOP', q) end
  end
  if done > 0 then redis.call('DECRBY', P .. 'garbage', done) end
  return done
end

-- Empty a slot's held set in O(1) by queueing it for gc(); returns the blocks it had.
local function retire(slot)
  local held = P .. 'held:' .. slot
  local blocks = redis.call('SCARD', held)
  if blocks > 0 then
    local item = slot .. ':' .. redis.call('INCR', P .. 'gcseq')
    redis.call('RENAME', held, P .. 'gc:' .. item)
    redis.call('RPUSH', P .. 'gcq', item)
    redis.call('INCRBY', P .. 'garbage', blocks)
  end
  return blocks
end
"""

# ARGV: P, max_entries, gc_chunk, max_replicas, replica_id, epoch, seq, n_events,
#       then per event: kind ('s' | 'r' | 'c'), its hashes as one string of 16-hex-digit
#       fields (one argument instead of one per hash: far cheaper to pack and to pass).
# Returns {status, applied, dropped, synced}; status '' | 'epoch' | 'gap' | 'duplicate' | 'full'.
APPLY = _PRELUDE + """
local max_entries, gc_chunk, max_replicas = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local rid, epoch, seq, n = ARGV[5], ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local batch_last = seq + n - 1
local meta, stats = P .. 'r:' .. rid, P .. 'stats'
redis.call('HINCRBY', stats, 'batches', 1)
local cur = redis.call('HMGET', meta, 'epoch', 'last_seq', 'slot', 'synced')
local slot, reset, skip, synced = cur[3], '', 0, cur[4] == '1'
if not slot then
  if redis.call('HLEN', P .. 'replicas') >= max_replicas then return {'full', 0, 0, 0} end
  slot = redis.call('LPOP', P .. 'free') or fmt(redis.call('INCR', P .. 'next_slot') - 1)
  redis.call('HSET', P .. 'replicas', rid, slot)
  redis.call('HSET', P .. 'slots', slot, rid)
  redis.call('HSET', meta, 'slot', slot)
  synced = seq == 0
elseif cur[1] ~= epoch then
  retire(slot)
  reset, synced = 'epoch', seq == 0
  redis.call('HINCRBY', meta, 'epoch_changes', 1)
  redis.call('HINCRBY', stats, 'epoch_changes', 1)
else
  local last = tonumber(cur[2])
  if seq > last + 1 then
    retire(slot)
    reset, synced = 'gap', false
    redis.call('HINCRBY', meta, 'gaps', 1)
    redis.call('HINCRBY', stats, 'gaps', 1)
  elseif seq <= last and batch_last <= last then
    redis.call('HINCRBY', meta, 'duplicate_batches', 1)
    redis.call('HINCRBY', stats, 'duplicate_batches', 1)
    return {'duplicate', 0, 0, synced and 1 or 0}
  else
    skip = last + 1 - seq
  end
end
local held = P .. 'held:' .. slot
local entries = tonumber(redis.call('GET', P .. 'entries') or '0') - gc(gc_chunk)
local dropped = 0
for e = 1, n do
  local kind, blob = ARGV[7 + 2 * e], ARGV[8 + 2 * e]
  local cnt = #blob / 16
  if e <= skip then
  elseif kind == 's' then
    -- Reclaim garbage on demand, never more than this event adds, so a call stays
    -- proportional to its batch.
    local need = entries + cnt - max_entries
    if need > 0 then entries = entries - gc(need) end
    for j = 1, cnt do
      local h = string.sub(blob, 16 * j - 15, 16 * j)
      if entries < max_entries then
        if redis.call('SADD', held, h) == 1 then
          redis.call('SADD', P .. 'b:' .. h, slot)
          entries = entries + 1
        end
      elseif redis.call('SISMEMBER', held, h) == 0 then
        dropped = dropped + 1
      end
    end
  elseif kind == 'r' then
    for j = 1, cnt do
      local h = string.sub(blob, 16 * j - 15, 16 * j)
      if redis.call('SREM', held, h) == 1 then
        redis.call('SREM', P .. 'b:' .. h, slot)
        entries = entries - 1
      end
    end
  else
    retire(slot)
    synced = true
  end
end
if dropped > 0 then
  synced = false
  redis.call('HINCRBY', meta, 'dropped_entries', dropped)
  redis.call('HINCRBY', stats, 'dropped_entries', dropped)
end
local applied = n - skip
redis.call('HSET', meta, 'epoch', epoch, 'last_seq', fmt(batch_last), 'synced', synced and '1' or '0')
redis.call('HINCRBY', meta, 'applied_events', applied)
redis.call('HINCRBY', stats, 'applied_events', applied)
redis.call('SET', P .. 'entries', fmt(entries))
return {reset, applied, dropped, synced and 1 or 0}
"""

# ARGV: P, the prompt's hashes as one string of 16-hex-digit fields.
# Returns {replica_id, prefix_length, ...} for lengths > 0.
LOOKUP = """
local P, blob, FIRST, MAXCHUNK = ARGV[1], ARGV[2], %d, %d
local last = #blob / 16
if last < 1 then return {} end
local hs = {}
for j = 1, last do hs[j] = string.sub(blob, 16 * j - 15, 16 * j) end
local found, lengths = {}, {}
for _, slot in ipairs(redis.call('SMEMBERS', P .. 'b:' .. hs[1])) do
  -- Chunks double from FIRST: a short match costs few checks, a long one few calls.
  local held, len, pos, chunk = P .. 'held:' .. slot, 0, 1, FIRST
  while pos <= last do
    local hit = redis.call('SMISMEMBER', held, unpack(hs, pos, math.min(pos + chunk - 1, last)))
    local k = 1
    while hit[k] == 1 do k = k + 1 end
    len = len + k - 1
    if k <= #hit then break end
    pos = pos + chunk
    chunk = math.min(chunk * 2, MAXCHUNK)
  end
  if len > 0 then
    found[#found + 1] = slot
    lengths[#lengths + 1] = len
  end
end
if #found == 0 then return {} end
local names = redis.call('HMGET', P .. 'slots', unpack(found))
local out = {}
for k = 1, #found do
  out[#out + 1] = names[k]
  out[#out + 1] = lengths[k]
end
return out
""" % (LOOKUP_FIRST_CHUNK, LOOKUP_MAX_CHUNK)

# ARGV: P, replica_id.  Returns the blocks the replica had (0 if unknown).
FORGET = _PRELUDE + """
local rid = ARGV[2]
local meta = P .. 'r:' .. rid
local slot = redis.call('HGET', meta, 'slot')
if not slot then return 0 end
local blocks = retire(slot)
redis.call('DEL', meta)
redis.call('HDEL', P .. 'replicas', rid)
redis.call('HDEL', P .. 'slots', slot)
redis.call('RPUSH', P .. 'free', slot)
return blocks
"""

# ARGV: P, budget.  Returns {unlinked, retired sets still queued}.
COLLECT = _PRELUDE + """
local done = gc(tonumber(ARGV[2]))
if done > 0 then redis.call('DECRBY', P .. 'entries', done) end
return {done, redis.call('LLEN', P .. 'gcq')}
"""

STATE_FIELDS = ("epoch", "last_seq", "synced", "gaps", "epoch_changes", "duplicate_batches",
                "dropped_entries", "applied_events")

# ARGV: P.  Returns per replica: id, blocks, then STATE_FIELDS in order.
STATE = """
local P = ARGV[1]
local rows = redis.call('HGETALL', P .. 'replicas')
local out = {}
for k = 1, #rows, 2 do
  local rid, slot = rows[k], rows[k + 1]
  out[#out + 1] = rid
  out[#out + 1] = redis.call('SCARD', P .. 'held:' .. slot)
  local f = redis.call('HMGET', P .. 'r:' .. rid, %s)
  for j = 1, %d do out[#out + 1] = f[j] or '0' end
end
return out
""" % (", ".join(f"'{f}'" for f in STATE_FIELDS), len(STATE_FIELDS))
