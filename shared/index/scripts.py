"""Lua scripts of the Redis prefix index.  Each runs atomically in one round trip.

Key layout, all under ``P = kvemu:<cluster>:`` (hashes as 16 hex digits):

    P b:<hash>         SET of members gen*4096+slot: who holds the block (integers, so
                       Redis keeps each set as a compact intset)
    P held:<slot>      SET of hashes held by the slot's current generation
    P r:<replica_id>   HASH epoch, last_seq, slot, synced and per-replica counters
    P replicas         HASH replica_id -> slot       P slots   HASH slot -> replica_id
    P gens             HASH slot -> current generation (monotonic, survives slot reuse)
    P free             LIST of free slots            P next_slot  counter
    P entries          (hash, member) pairs stored, garbage included: the bound
    P garbage          how many of those belong to retired generations
    P gcq              LIST of "slot:gen" generations awaiting unlinking
    P gc:<slot>:<gen>  SET of hashes of a retired generation
    P stats            HASH cluster-wide counters

Clearing a replica (restart, gap, ``cleared`` event, ``clear_replica``) bumps its slot's
generation, which invalidates every ``b:`` member of the old generation at once (lookup
checks the generation), and renames ``held:<slot>`` onto the GC queue.  Garbage is unlinked
a bounded chunk at a time by later calls, so no call ever walks the keyspace or a whole
replica.  Keys are built inside the scripts, so this needs a standalone Redis (or one
Cluster shard), not Redis Cluster.
"""

from __future__ import annotations

SLOT_BITS = 12
MAX_SLOTS = 1 << SLOT_BITS

_PRELUDE = """
local P = ARGV[1]
local SLOTS = %d
-- Lua counts in doubles; %%d formatting keeps integers from turning into 1e+15 strings.
local function fmt(x) return string.format('%%d', x) end

-- Unlink up to `budget` entries of retired generations; returns how many.
local function gc(budget)
  local done = 0
  local q = P .. 'gcq'
  while done < budget do
    local item = redis.call('LINDEX', q, 0)
    if not item then break end
    local sep = string.find(item, ':', 1, true)
    local member = fmt(tonumber(string.sub(item, sep + 1)) * SLOTS + tonumber(string.sub(item, 1, sep - 1)))
    local gkey = P .. 'gc:' .. item
    local hs = redis.call('SPOP', gkey, budget - done)
    for _, h in ipairs(hs) do
      redis.call('SREM', P .. 'b:' .. h, member)
    end
    done = done + #hs
    if redis.call('EXISTS', gkey) == 0 then redis.call('LPOP', q) end
  end
  if done > 0 then redis.call('DECRBY', P .. 'garbage', done) end
  return done
end

-- Retire a slot's generation in O(1); returns the new generation and the blocks it had.
local function retire(slot)
  local gens = P .. 'gens'
  local old = redis.call('HGET', gens, slot) or '0'
  local gen = redis.call('HINCRBY', gens, slot, 1)
  local held = P .. 'held:' .. slot
  local blocks = redis.call('SCARD', held)
  if blocks > 0 then
    local item = slot .. ':' .. old
    redis.call('RENAME', held, P .. 'gc:' .. item)
    redis.call('RPUSH', P .. 'gcq', item)
    redis.call('INCRBY', P .. 'garbage', blocks)
  end
  return gen, blocks
end
""" % MAX_SLOTS

# ARGV: P, max_entries, gc_chunk, max_replicas, replica_id, epoch, seq, n_events,
#       then per event: kind ('s' | 'r' | 'c'), count, hashes...
# Returns {status, applied, dropped, synced}; status '' | 'epoch' | 'gap' | 'duplicate' | 'full'.
APPLY = _PRELUDE + """
local max_entries, gc_chunk, max_replicas = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local rid, epoch, seq, n = ARGV[5], ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local batch_last = seq + n - 1
local meta, stats = P .. 'r:' .. rid, P .. 'stats'
redis.call('HINCRBY', stats, 'batches', 1)
local cur = redis.call('HMGET', meta, 'epoch', 'last_seq', 'slot', 'synced')
local slot, gen, reset, skip, synced = cur[3], nil, '', 0, cur[4] == '1'
if not slot then
  if redis.call('HLEN', P .. 'replicas') >= max_replicas then return {'full', 0, 0, 0} end
  slot = redis.call('LPOP', P .. 'free') or fmt(redis.call('INCR', P .. 'next_slot') - 1)
  gen = redis.call('HINCRBY', P .. 'gens', slot, 1)
  redis.call('HSET', P .. 'replicas', rid, slot)
  redis.call('HSET', P .. 'slots', slot, rid)
  redis.call('HSET', meta, 'slot', slot)
  synced = seq == 0
elseif cur[1] ~= epoch then
  gen = retire(slot)
  reset, synced = 'epoch', seq == 0
  redis.call('HINCRBY', meta, 'epoch_changes', 1)
  redis.call('HINCRBY', stats, 'epoch_changes', 1)
else
  local last = tonumber(cur[2])
  if seq > last + 1 then
    gen = retire(slot)
    reset, synced = 'gap', false
    redis.call('HINCRBY', meta, 'gaps', 1)
    redis.call('HINCRBY', stats, 'gaps', 1)
  elseif seq <= last and batch_last <= last then
    redis.call('HINCRBY', meta, 'duplicate_batches', 1)
    redis.call('HINCRBY', stats, 'duplicate_batches', 1)
    return {'duplicate', 0, 0, synced and 1 or 0}
  else
    skip = last + 1 - seq
    gen = tonumber(redis.call('HGET', P .. 'gens', slot))
  end
end
local member = fmt(gen * SLOTS + tonumber(slot))
local held = P .. 'held:' .. slot
local entries = tonumber(redis.call('GET', P .. 'entries') or '0') - gc(gc_chunk)
local dropped, i = 0, 9
for e = 1, n do
  local kind, cnt = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 2
  if e <= skip then
  elseif kind == 's' then
    -- Reclaim garbage on demand, never more than this event adds, so a call stays
    -- proportional to its batch.
    local need = entries + cnt - max_entries
    if need > 0 then entries = entries - gc(need) end
    for j = i, i + cnt - 1 do
      local h = ARGV[j]
      if entries < max_entries then
        if redis.call('SADD', held, h) == 1 then
          redis.call('SADD', P .. 'b:' .. h, member)
          entries = entries + 1
        end
      elseif redis.call('SISMEMBER', held, h) == 0 then
        dropped = dropped + 1
      end
    end
  elseif kind == 'r' then
    for j = i, i + cnt - 1 do
      local h = ARGV[j]
      if redis.call('SREM', held, h) == 1 then
        redis.call('SREM', P .. 'b:' .. h, member)
        entries = entries - 1
      end
    end
  else
    gen = retire(slot)
    member = fmt(gen * SLOTS + tonumber(slot))
    synced = true
  end
  i = i + cnt
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

# ARGV: P, hashes...  Returns {replica_id, prefix_length, ...} for lengths > 0.
LOOKUP = """
local P = ARGV[1]
local SLOTS = %d
local n = #ARGV - 1
if n < 1 then return {} end
local first = redis.call('SMEMBERS', P .. 'b:' .. ARGV[2])
if #first == 0 then return {} end
-- Members of retired generations may linger until GC: keep current ones only.
local cand, gens, known = {}, P .. 'gens', {}
for _, m in ipairs(first) do
  local v = tonumber(m)
  local slot = v %% SLOTS
  local g = known[slot]
  if g == nil then
    g = tonumber(redis.call('HGET', gens, string.format('%%d', slot)) or '-1')
    known[slot] = g
  end
  if g == (v - slot) / SLOTS then cand[#cand + 1] = m end
end
local found = {}
for i = 3, #ARGV do
  if #cand == 0 then break end
  local hit = redis.call('SMISMEMBER', P .. 'b:' .. ARGV[i], unpack(cand))
  local keep = {}
  for k, m in ipairs(cand) do
    if hit[k] == 1 then keep[#keep + 1] = m else found[#found + 1] = {m, i - 2} end
  end
  cand = keep
end
for _, m in ipairs(cand) do found[#found + 1] = {m, n} end
local out, slots = {}, P .. 'slots'
for _, f in ipairs(found) do
  out[#out + 1] = redis.call('HGET', slots, string.format('%%d', tonumber(f[1]) %% SLOTS))
  out[#out + 1] = f[2]
end
return out
""" % MAX_SLOTS

# ARGV: P, replica_id.  Returns the blocks the replica had (0 if unknown).
FORGET = _PRELUDE + """
local rid = ARGV[2]
local meta = P .. 'r:' .. rid
local slot = redis.call('HGET', meta, 'slot')
if not slot then return 0 end
local _, blocks = retire(slot)
redis.call('DEL', meta)
redis.call('HDEL', P .. 'replicas', rid)
redis.call('HDEL', P .. 'slots', slot)
redis.call('RPUSH', P .. 'free', slot)
return blocks
"""

# ARGV: P, budget.  Returns {unlinked, generations still queued}.
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
