"""Lua scripts of the Redis prefix index.  Each runs atomically in one round trip.

Key layout, all under ``P = kvemu:<cluster>:`` (hashes as 16 hex digits):

    P b:<hash>         STRING bitmap, bit <slot> set if that replica holds the block
                       (2 bytes for 16 replicas); deleted when no bit is left
    P held:<slot>      SET of hashes the replica in that slot holds: the ground truth
    P lo:<slot>:<lvl>  SET of hashes its memory level <lvl> holds (1 host DRAM, 2 SSD, ...:
                       level events; no bitmaps)
    P lv:<slot>        SET of the levels whose lo: set is not empty
    P tiered           SET of slots that hold blocks in a lower level
    P stores           HASH store_id -> 1: the feeds that are shared stores' (``add_store``); a store
                       has a slot and meta like a replica, its blocks in held:<slot> with no bitmaps
    P r:<replica_id>   HASH epoch, last_seq, slot, synced and per-replica counters
    P replicas         HASH replica_id -> slot       P slots   HASH slot -> replica_id
    P free             LIST of free slots            P next_slot  counter
    P entries          (hash, replica) pairs stored, garbage included: the bound
    P garbage          how many of those belong to retired held sets
    P dirty            HASH slot -> retired entries of that slot not yet unlinked
    P gcq              LIST of "slot:n" retired held sets awaiting unlinking
    P gc:<slot>:<n>    a retired held set (n from the P gcseq counter)
    P stats            HASH cluster-wide counters

Lookup: MGET the prompt's bitmaps (chunks doubling from 8, stopping once no candidate is
left) and AND them in Lua; a replica's prefix length is where its bit first drops out.
That is ~3 commands for a 64-block prompt whatever the number of replicas. Then each slot in
``tiered`` walks the sets of its levels (``lv:``, upper level first) from its HBM prefix
(SMISMEMBER in doubling chunks) for the run of blocks they hold, reported as ``<id>#<lvl>``.
Shared stores: the caller passes each store's scope (its id, its level, the replicas it serves,
none: every replica that is no store); each served replica walks its own levels (below the
store's) and then the store's held set, from its HBM prefix, answered as ``<id>#<lvl>`` per level.

Clearing a replica (restart, gap, ``cleared`` event, ``clear_replica``) renames its held
set onto the GC queue: O(1) and atomic; its lower-tier sets are UNLINKed (they carry no
bitmaps, and UNLINK frees a big set off the main thread).  Its bits in ``b:`` keys stay set until gc()
unlinks them, a bounded chunk at a time in later calls, so no call walks the keyspace or
a whole replica.  Meanwhile the slot is listed in ``dirty`` and lookup checks a dirty
slot's answer against its held set, so stale bits never produce a false hit.  Keys are
built inside the scripts, so this needs a standalone Redis (or one Cluster shard), not
Redis Cluster.
"""

from __future__ import annotations

from shared.index.base import MAX_LEVEL

MAX_SLOTS = 4096
LOOKUP_FIRST_CHUNK = 8
LOOKUP_MAX_CHUNK = 256

_PRELUDE = """
local P = ARGV[1]
-- Lua counts in doubles; %d formatting keeps integers from turning into 1e+15 strings.
local function fmt(x) return string.format('%d', x) end

-- Clear a slot's bit for a block; drop the bitmap once empty so keys do not pile up.
local function unset(h, slot)
  local key = P .. 'b:' .. h
  redis.call('SETBIT', key, slot, 0)
  if redis.call('BITCOUNT', key) == 0 then redis.call('DEL', key) end
end

-- Unlink up to `budget` entries of retired held sets; returns how many.
local function gc(budget)
  local done, q = 0, P .. 'gcq'
  while done < budget do
    local item = redis.call('LINDEX', q, 0)
    if not item then break end
    local slot = string.sub(item, 1, string.find(item, ':', 1, true) - 1)
    local gkey, held = P .. 'gc:' .. item, P .. 'held:' .. slot
    local hs = redis.call('SPOP', gkey, budget - done)
    -- a shared store in the slot now sets no bits: none of the lingering ones is its own
    local owner = redis.call('HGET', P .. 'slots', slot)
    local store = owner and redis.call('HEXISTS', P .. 'stores', owner) == 1
    for _, h in ipairs(hs) do
      -- The slot's current occupant may hold the block again: the bit is then its own.
      if store or redis.call('SISMEMBER', held, h) == 0 then unset(h, slot) end
    end
    done = done + #hs
    if redis.call('HINCRBY', P .. 'dirty', slot, -#hs) <= 0 then redis.call('HDEL', P .. 'dirty', slot) end
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
    redis.call('HINCRBY', P .. 'dirty', slot, blocks)
  end
  return blocks
end

-- Drop a slot's lower-level sets; returns how many entries they held (the caller counts them off).
local function drop_lower(slot)
  local lv, n = P .. 'lv:' .. slot, 0
  for _, l in ipairs(redis.call('SMEMBERS', lv)) do
    local key = P .. 'lo:' .. slot .. ':' .. l
    n = n + redis.call('SCARD', key)
    redis.call('UNLINK', key)
  end
  redis.call('DEL', lv)
  redis.call('SREM', P .. 'tiered', slot)
  return n
end
"""

# ARGV: P, max_entries, gc_chunk, max_replicas, replica_id, epoch, seq, n_events,
#       then per event: kind ('s' | 'r' | 'c', then ':<level>' for a lower level), its hashes as one string of 16-hex-digit
#       fields (one argument instead of one per hash: far cheaper to pack and to pass).
# Returns {status, applied, dropped, synced}; status '' | 'epoch' | 'gap' | 'duplicate' | 'full'.
APPLY = _PRELUDE + """
local max_entries, gc_chunk, max_replicas = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local rid, epoch, seq, n = ARGV[5], ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local batch_last = seq + n - 1
local meta, stats = P .. 'r:' .. rid, P .. 'stats'
redis.call('HINCRBY', stats, 'batches', 1)
local cur = redis.call('HMGET', meta, 'epoch', 'last_seq', 'slot', 'synced')
local slot, reset, skip, synced, lower_gone = cur[3], '', 0, cur[4] == '1', 0
-- a shared store's feed: its blocks are held:<slot> with no bitmaps, whatever level its events name
local store = redis.call('HEXISTS', P .. 'stores', rid) == 1
if not slot then
  if redis.call('HLEN', P .. 'replicas') >= max_replicas then return {'full', 0, 0, 0} end
  slot = redis.call('LPOP', P .. 'free') or fmt(redis.call('INCR', P .. 'next_slot') - 1)
  redis.call('HSET', P .. 'replicas', rid, slot)
  redis.call('HSET', P .. 'slots', slot, rid)
  redis.call('HSET', meta, 'slot', slot)
  synced = seq == 0
elseif cur[1] ~= epoch then
  retire(slot)
  lower_gone = drop_lower(slot)
  reset, synced = 'epoch', seq == 0
  redis.call('HINCRBY', meta, 'epoch_changes', 1)
  redis.call('HINCRBY', stats, 'epoch_changes', 1)
else
  local last = tonumber(cur[2])
  if seq > last + 1 then
    retire(slot)
    lower_gone = drop_lower(slot)
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
local entries = tonumber(redis.call('GET', P .. 'entries') or '0') - gc(gc_chunk) - lower_gone
local dropped = 0
for e = 1, n do
  local code, blob = ARGV[7 + 2 * e], ARGV[8 + 2 * e]
  local kind, tier, cnt = string.sub(code, 1, 1), string.sub(code, 3), #blob / 16
  if store and tier ~= '' then tier = '' end
  if e <= skip then
  elseif tier ~= '' then
    local lkey = P .. 'lo:' .. slot .. ':' .. tier
    if kind == 's' then
      local need = entries + cnt - max_entries
      if need > 0 then entries = entries - gc(need) end
      for j = 1, cnt do
        local h = string.sub(blob, 16 * j - 15, 16 * j)
        if entries < max_entries then
          if redis.call('SADD', lkey, h) == 1 then entries = entries + 1 end
        elseif redis.call('SISMEMBER', lkey, h) == 0 then
          dropped = dropped + 1
        end
      end
      if redis.call('EXISTS', lkey) == 1 then
        redis.call('SADD', P .. 'lv:' .. slot, tier)
        redis.call('SADD', P .. 'tiered', slot)
      end
    else
      for j = 1, cnt do
        if redis.call('SREM', lkey, string.sub(blob, 16 * j - 15, 16 * j)) == 1 then entries = entries - 1 end
      end
      if redis.call('EXISTS', lkey) == 0 then
        redis.call('SREM', P .. 'lv:' .. slot, tier)
        if redis.call('EXISTS', P .. 'lv:' .. slot) == 0 then redis.call('SREM', P .. 'tiered', slot) end
      end
    end
  elseif kind == 's' then
    -- Reclaim garbage on demand, never more than this event adds, so a call stays
    -- proportional to its batch.
    local need = entries + cnt - max_entries
    if need > 0 then entries = entries - gc(need) end
    for j = 1, cnt do
      local h = string.sub(blob, 16 * j - 15, 16 * j)
      if entries < max_entries then
        if redis.call('SADD', held, h) == 1 then
          if not store then redis.call('SETBIT', P .. 'b:' .. h, slot, 1) end
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
        if not store then unset(h, slot) end
        entries = entries - 1
      end
    end
  else
    retire(slot)
    entries = entries - drop_lower(slot)
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

# ARGV: P, the prompt's hashes as one string of 16-hex-digit fields, then per shared store: its id, its level
# and the replicas it serves as a comma list ('' : every replica that is no store).
# Returns {replica_id, prefix_length, ...} for lengths > 0, then {"<id>#<level>", run, ...}.
LOOKUP = """
local P, blob, FIRST, MAXCHUNK = ARGV[1], ARGV[2], %d, %d
local band = bit.band
local last = #blob / 16
if last < 1 then return {} end
local hs = {}
for j = 1, last do hs[j] = string.sub(blob, 16 * j - 15, 16 * j) end

-- HBM: {slot, prefix length} per slot whose bit the prompt's first block has.
local function walk()
  -- cand: byte index -> bits of the slots still matching; SETBIT numbers bits from the MSB.
  local cand, active, found = nil, 0, {}
  local function drop(j, bits, n)
    for b = 0, 7 do
      if band(bits, 128 / 2 ^ b) ~= 0 then found[#found + 1] = {(j - 1) * 8 + b, n} end
    end
  end
  local pos, chunk, prev = 1, FIRST, nil
  while pos <= last and (cand == nil or active > 0) do
    local stop, keys = math.min(pos + chunk - 1, last), {}
    for k = pos, stop do keys[#keys + 1] = P .. 'b:' .. hs[k] end
    local vals = redis.call('MGET', unpack(keys))
    for k = 1, #vals do
      local v, i = vals[k] or '', pos + k - 1
      -- Lua strings are interned, so this compare is O(1); consecutive blocks usually
      -- have the same holders, and then the candidates cannot change.
      if v == prev then
      elseif cand == nil then
        cand = {}
        for j = 1, #v do
          local c = string.byte(v, j)
          if c ~= 0 then cand[j], active = c, active + 1 end
        end
        if active == 0 then return found end
      else
        for j, c in pairs(cand) do
          local nb = band(c, string.byte(v, j) or 0)
          if nb ~= c then
            drop(j, c - nb, i - 1)
            if nb == 0 then cand[j], active = nil, active - 1 else cand[j] = nb end
          end
        end
        if active == 0 then return found end
      end
      prev = v
    end
    pos, chunk = stop + 1, math.min(chunk * 2, MAXCHUNK)
  end
  for j, c in pairs(cand) do drop(j, c, last) end
  return found
end

local found, out, prefix = walk(), {}, {}
if #found > 0 then
  local slots = {}
  for k, f in ipairs(found) do slots[k] = string.format('%%d', f[1]) end
  local dirty = redis.call('HMGET', P .. 'dirty', unpack(slots))
  local names = redis.call('HMGET', P .. 'slots', unpack(slots))
  for k, f in ipairs(found) do
    local n = f[2]
    if dirty[k] then
      -- Retired bits of this slot may linger: count only what its held set confirms.
      local held, upto = P .. 'held:' .. slots[k], n
      n = 0
      while n < upto do
        local hit = redis.call('SMISMEMBER', held, unpack(hs, n + 1, math.min(n + MAXCHUNK, upto)))
        local m = 0
        while hit[m + 1] == 1 do m = m + 1 end
        n = n + m
        if m < #hit then break end
      end
    end
    if n > 0 and names[k] and redis.call('HEXISTS', P .. 'stores', names[k]) == 0 then
      out[#out + 1] = names[k]
      out[#out + 1] = n
      prefix[slots[k]] = n
    end
  end
end

-- The run from position i of the prompt that the sets `keys` (levels `nums`, upper first) hold: name#level counts.
local function walk_levels(name, i, keys, nums)
  local counts, chunk, going = {}, FIRST, true
  for k = 1, #keys do counts[k] = 0 end
  while going and i <= last do
    local stop, held = math.min(i + chunk - 1, last), {}
    for k, key in ipairs(keys) do held[k] = redis.call('SMISMEMBER', key, unpack(hs, i, stop)) end
    for j = 1, stop - i + 1 do
      local k = 1
      while k <= #keys and held[k][j] ~= 1 do k = k + 1 end
      if k > #keys then going = false break end
      counts[k] = counts[k] + 1
    end
    i, chunk = stop + 1, math.min(chunk * 2, MAXCHUNK)
  end
  for k = 1, #keys do
    if counts[k] > 0 then out[#out + 1] = name .. '#' .. nums[k]; out[#out + 1] = counts[k] end
  end
end

-- A slot's own levels below HBM, upper first (below `cap` only, when a store is the level at `cap`).
local function own_levels(slot, cap)
  local keys, nums = {}, {}
  if not slot then return keys, nums end
  local levels = redis.call('SMEMBERS', P .. 'lv:' .. slot)
  for k, l in ipairs(levels) do levels[k] = tonumber(l) end
  table.sort(levels)
  for _, l in ipairs(levels) do
    if not cap or l < cap then keys[#keys + 1] = P .. 'lo:' .. slot .. ':' .. l; nums[#nums + 1] = l end
  end
  return keys, nums
end

-- Shared stores (ARGV from 3: store_id, level, the replicas it serves as a comma list, '' for all): each
-- replica served, by the first store listed that serves it, with its store's level and held set.
local served, order = {}, {}
for a = 3, #ARGV, 3 do
  local sid, lvl, csv = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2]
  local sslot = redis.call('HGET', P .. 'replicas', sid)
  if sslot and redis.call('HEXISTS', P .. 'stores', sid) == 1 and redis.call('SCARD', P .. 'held:' .. sslot) > 0 then
    local names = {}
    if csv == '' then
      local all = redis.call('HGETALL', P .. 'replicas')
      for k = 1, #all, 2 do
        if redis.call('HEXISTS', P .. 'stores', all[k]) == 0 then names[#names + 1] = all[k] end
      end
    else
      for name in string.gmatch(csv, '[^,]+') do names[#names + 1] = name end
    end
    for _, name in ipairs(names) do
      if not served[name] then served[name] = {P .. 'held:' .. sslot, lvl}; order[#order + 1] = name end
    end
  end
end

-- Lower levels: from each tiered slot's HBM prefix, the run its level sets hold (upper level first).
for _, slot in ipairs(redis.call('SMEMBERS', P .. 'tiered')) do
  local name = redis.call('HGET', P .. 'slots', slot)
  if name and not served[name] then
    local keys, nums = own_levels(slot, nil)
    walk_levels(name, (prefix[slot] or 0) + 1, keys, nums)
  end
end
-- Replicas a store serves: their own levels, then the store's.
for _, name in ipairs(order) do
  local slot = redis.call('HGET', P .. 'replicas', name)
  local keys, nums = own_levels(slot, served[name][2])
  keys[#keys + 1] = served[name][1]
  nums[#nums + 1] = served[name][2]
  walk_levels(name, ((slot and prefix[slot]) or 0) + 1, keys, nums)
end
return out
""" % (LOOKUP_FIRST_CHUNK, LOOKUP_MAX_CHUNK)  # noqa: UP031  (Lua braces make str.format awkward)

# ARGV: P, replica_id.  Returns the blocks the replica had (0 if unknown).
FORGET = _PRELUDE + """
local rid = ARGV[2]
local meta = P .. 'r:' .. rid
local slot = redis.call('HGET', meta, 'slot')
if not slot then return 0 end
local blocks = retire(slot)
redis.call('DECRBY', P .. 'entries', drop_lower(slot))
redis.call('DEL', meta)
redis.call('HDEL', P .. 'replicas', rid)
redis.call('HDEL', P .. 'slots', slot)
redis.call('RPUSH', P .. 'free', slot)
return blocks
"""

# ARGV: P, store_id.  Declares the feed a shared store's; entries it had as a replica are cleared (not synced
# until its next cleared event).  Returns 1 when newly declared.
DECLARE = _PRELUDE + """
local sid = ARGV[2]
if redis.call('HSETNX', P .. 'stores', sid, '1') == 0 then return 0 end
local meta = P .. 'r:' .. sid
local slot = redis.call('HGET', meta, 'slot')
if slot then
  retire(slot)
  redis.call('DECRBY', P .. 'entries', drop_lower(slot))
  redis.call('HSET', meta, 'synced', '0')
end
return 1
"""

# ARGV: P, budget.  Returns {unlinked, retired sets still queued}.
COLLECT = _PRELUDE + """
local done = gc(tonumber(ARGV[2]))
if done > 0 then redis.call('DECRBY', P .. 'entries', done) end
return {done, redis.call('LLEN', P .. 'gcq')}
"""

STATE_FIELDS = ("epoch", "last_seq", "synced", "gaps", "epoch_changes", "duplicate_batches",
                "dropped_entries", "applied_events")

# ARGV: P.  Returns per replica: id, blocks, the blocks of levels 1..MAX_LEVEL, then STATE_FIELDS in order.
STATE = """
local P = ARGV[1]
local rows = redis.call('HGETALL', P .. 'replicas')
local out = {}
for k = 1, #rows, 2 do
  local rid, slot = rows[k], rows[k + 1]
  out[#out + 1] = rid
  out[#out + 1] = redis.call('SCARD', P .. 'held:' .. slot)
  for l = 1, %d do out[#out + 1] = redis.call('SCARD', P .. 'lo:' .. slot .. ':' .. l) end
  local f = redis.call('HMGET', P .. 'r:' .. rid, %s)
  for j = 1, %d do out[#out + 1] = f[j] or '0' end
end
return out
""" % (MAX_LEVEL, ", ".join(f"'{f}'" for f in STATE_FIELDS), len(STATE_FIELDS))  # noqa: UP031
