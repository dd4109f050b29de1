-- Prepended to every script of the fleet protocol (docs/fleet.md; redis_port.rs sends them).
-- A queue's whole state is ONE hash, KEYS[1], so an eviction takes all of it or none, and
-- `reserved` / `carried` are never stored: they are sums over the live `b:` / `c:` fields,
-- so no lost or doubled write can leave a running total wrong.
--
-- Fields: epoch (TIME µs when made), version (bumped by every write), born (ms), run (the
-- run_id of the Redis process that made it);
-- the published read: state ('ok' | 'failed' | absent = never), backlog (the last good read's,
-- left standing by a failed one), send_disabled,
-- taken_ms (when its lease was taken), streak, generation, paced (the published reads not
-- made at the ceiling) and paced_ms (when the last one's lease was taken), reads_ok,
-- reads_failed,
-- published_seq; the read lease: lease_holder, lease_until, ticket_seq, t:<seq> = when
-- ticket <seq>'s lease was taken; completed_total, since_read; lag_buckets = "n:count ..."
-- (newest first), the stored sends settled in each 100 ms bucket n within the lag, in one
-- field rather than one per bucket: a lag holds ~120 buckets and every call loads and walks
-- the whole hash (r:<n> = one bucket, an older build's layout, is still read and pruned;
-- that build does not read lag_buckets: docs/fleet.md, "Bounds"); b:<block id> = "units:lease_end_ms"; c:<replica> =
-- "count:end_ms"; m:<replica> = until when it counts in the fleet's size (ms); l:<replica> /
-- a:<replica> = "lag_ms:until" / "max_read_age_ms:until", the terms it named last, kept as
-- long as its v:.
--
-- ARGV, the same head for every script:
--   1 hold_ms  2 lag_ms  3 max_read_age_ms  4 grace_ms  5 member_ms  6 idle_ms
--   7 replica  8 seen epoch id  9 seen version  10 carry
-- and each script's own arguments from ARGV[11] on. All time is this Redis's TIME.

local KEY = KEYS[1]
local HOLD = tonumber(ARGV[1]) or 0
local LAG = tonumber(ARGV[2]) or 0
local MAX_READ_AGE = tonumber(ARGV[3]) or 0
local GRACE = tonumber(ARGV[4]) or 0
local MEMBER = tonumber(ARGV[5]) or 0
-- PEXPIRE 0 would delete the hash at once.
local IDLE = math.max(1, tonumber(ARGV[6]) or 1)
local OWN = 11
-- The lag and read age the hash is pruned by: the longest any replica still around named
-- (its `l:` / `a:`), so a replica with shorter terms never prunes what another's ticket still
-- needs. Set by the preamble.
local KEEP_LAG, KEEP_READ_AGE = LAG, MAX_READ_AGE
-- A replica's `v:` field (the version of its last call) outlives its silence this long, so
-- a failover that lost writes it saw is noticed when it calls again; one away longer finds
-- none and the hash is made anew (the safe side).
local VERSION_KEPT_MS = 600000

-- Integers go out as plain digits: a double's own formatting (1.7e+15) would not parse
-- back, neither for HINCRBY nor for the client.
local function int(n)
  return string.format('%d', n)
end

-- A missing field (false) or a non-number counts as 0.
local function num(v)
  return tonumber(v) or 0
end

-- Redis TIME as ms (every term) and µs (a new epoch's id; below 2^53, exact as a double).
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

-- "a:b" (a block's units:lease_end, a carry's count:end); anything else holds nothing and
-- has already ended, so a malformed field is pruned rather than counted for ever.
local function pair(v)
  local a, b = string.match(v or '', '^(%d+):(%d+)$')
  return tonumber(a) or 0, tonumber(b) or 0
end

local function load()
  local flat = redis.call('HGETALL', KEY)
  local h = {}
  for i = 1, #flat, 2 do
    h[flat[i]] = flat[i + 1]
  end
  return h
end

-- Whether field f (value v) no longer counts at `now`. Lag buckets older than the lag (plus
-- a second, for the rounding) can no longer be subtracted from any ticket.
local function ended(f, v, now)
  local p = string.sub(f, 1, 2)
  if p == 'b:' or p == 'c:' then
    local _, e = pair(v)
    return e <= now
  elseif p == 'm:' then
    return num(v) <= now
  elseif p == 'v:' or p == 'l:' or p == 'a:' then
    local _, e = pair(v)
    return e <= now
  elseif p == 'r:' then
    return num(string.sub(f, 3)) < math.floor((now - KEEP_LAG - 1000) / 100)
  elseif p == 't:' then
    -- Published, its read would be older than reserve accepts: dropped (publish_read.lua
    -- finds no lease time), so unpublished tickets do not pile up.
    return now - num(v) > KEEP_READ_AGE
  end
  return false
end

-- The live sums: units in blocks, carries, members. Filtered by time even after a prune, so
-- `look` (which prunes nothing) answers the same.
local function sums(h, now)
  local reserved, carried, replicas = 0, 0, 0
  for f, v in pairs(h) do
    local p = string.sub(f, 1, 2)
    if p == 'b:' or p == 'c:' then
      local n, e = pair(v)
      if e > now then
        if p == 'b:' then reserved = reserved + n else carried = carried + n end
      end
    elseif p == 'm:' and num(v) > now then
      replicas = replicas + 1
    end
  end
  return reserved, carried, replicas
end

-- Writes go to Redis and to the table, so the reply is built from what was written.
local function hset(s, f, v)
  redis.call('HSET', KEY, f, v)
  s.h[f] = v
end

local function hdel(s, fields)
  -- unpack has a stack limit: delete in slices.
  for i = 1, #fields, 500 do
    redis.call('HDEL', KEY, unpack(fields, i, math.min(i + 499, #fields)))
  end
  for _, f in ipairs(fields) do
    s.h[f] = nil
  end
end

-- A new incarnation: its epoch is above the one the caller names, so the caller sees the
-- epoch change even when TIME stepped back across a failover.
local function make(s, seen_id)
  local epoch = math.max(s.now_us, seen_id + 1)
  s.h = { epoch = int(epoch), version = '0', born = int(s.now), run = s.run }
  redis.call('HSET', KEY, 'epoch', s.h.epoch, 'version', '0', 'born', s.h.born, 'run', s.run)
end

-- This Redis process's run_id: a restart or a replica promoted by a failover is another
-- process, with another id, whatever data it kept. Where scripts may not call INFO (an ACL
-- without @dangerous; Redis Enterprise, so Azure Managed Redis) it is '' on every process,
-- and a failover is noticed by epoch and version alone (docs/fleet.md, A4).
local function run_id()
  local ok, info = pcall(redis.call, 'INFO', 'server')
  if not ok or type(info) ~= 'string' then return '' end
  return string.match(info, 'run_id:(%x+)') or ''
end

-- What every call of a replica runs first (docs/fleet.md, steps 1 and 5). Returns the state
-- `s` = {now, now_us, h (the hash as a table), matched (the caller named this epoch)}.
local function preamble()
  local now, now_us = clock()
  local s = { now = now, now_us = now_us, h = load(), run = run_id() }
  local replica = ARGV[7]
  local seen_id, seen_version, carry = num(ARGV[8]), num(ARGV[9]), num(ARGV[10])
  if num(s.h.epoch) <= 0 then
    -- Missing (lost, evicted, expired, never made); fields without an epoch are not ours.
    if next(s.h) ~= nil then redis.call('DEL', KEY) end
    make(s, seen_id)
  else
    local epoch, version = num(s.h.epoch), num(s.h.version)
    -- The caller saw a state later than this one: writes were lost (a failover to a replica
    -- that had not seen them). What is left cannot be trusted to hold every block. The
    -- others' calls since may have raised `version` past what the caller saw, so its own
    -- last call's version (`v:`) is checked too: the hash has lost it if it is below.
    -- A hash another Redis process wrote (a failover's promoted replica, a restart from a
    -- snapshot) may have lost writes that no replica still calling saw: made anew too.
    local own = pair(s.h['v:' .. replica])
    if s.h.run ~= s.run or seen_id > epoch
      or (seen_id == epoch and (seen_version > version or seen_version > own)) then
      redis.call('DEL', KEY)
      make(s, seen_id)
    end
  end
  -- The caller's own fields are written in one HSET at the end, after the HDEL of those that
  -- ended (a field may be both: ended, and written anew).
  local puts = {}
  local function put(f, v)
    s.h[f] = v
    puts[#puts + 1] = f
    puts[#puts + 1] = v
  end
  -- This caller's terms now (they may have changed: a lag measured anew), kept as long as its
  -- version: a replica away longer finds the hash made anew anyway. Once a longer lag's
  -- replica is gone, the others' completions stop being counted on top of reads that show
  -- them; a maximum kept for the hash's life did that for as long as the fleet ran.
  local kept = int(now + VERSION_KEPT_MS)
  put('l:' .. replica, int(LAG) .. ':' .. kept)
  put('a:' .. replica, int(MAX_READ_AGE) .. ':' .. kept)
  -- The running maxima of an earlier layout, never lowered: no longer read.
  if s.h.lag_max or s.h.read_age_max then hdel(s, { 'lag_max', 'read_age_max' }) end
  KEEP_LAG, KEEP_READ_AGE = LAG, MAX_READ_AGE
  for f, v in pairs(s.h) do
    local p = string.sub(f, 1, 2)
    if p == 'l:' or p == 'a:' then
      local n, e = pair(v)
      if e > now then
        if p == 'l:' then KEEP_LAG = math.max(KEEP_LAG, n) else KEEP_READ_AGE = math.max(KEEP_READ_AGE, n) end
      end
    end
  end
  s.matched = num(s.h.epoch) == seen_id
  local gone = {}
  for f, v in pairs(s.h) do
    if ended(f, v, now) then gone[#gone + 1] = f end
  end
  -- A carry is counted against the epoch it was reckoned for: from a caller naming another,
  -- it would be its admissions relative to the wrong state. That caller adopts the epoch
  -- from the reply and calls again.
  local carry_field = 'c:' .. replica
  if s.matched and carry <= 0 and s.h[carry_field] then gone[#gone + 1] = carry_field end
  hdel(s, gone)
  put('m:' .. replica, int(now + MEMBER))
  if s.matched and carry > 0 then
    put(carry_field, int(carry) .. ':' .. int(now + HOLD))
  end
  put('version', int(num(s.h.version) + 1))
  put('v:' .. replica, s.h.version .. ':' .. kept)
  redis.call('HSET', KEY, unpack(puts))
  redis.call('PEXPIRE', KEY, IDLE)
  return s
end

-- Stored sends settled now: counted on top of the read, and in the lag bucket of now so a
-- ticket taken within the lag still counts them (the admin plane may not show them yet).
local function complete(s, stored)
  if stored <= 0 then return end
  hset(s, 'completed_total', int(num(s.h.completed_total) + stored))
  hset(s, 'since_read', int(num(s.h.since_read) + stored))
  if KEEP_LAG > 0 then
    local current = math.floor(s.now / 100)
    local packed = s.h.lag_buckets or ''
    local n, c, rest = string.match(packed, '^(%d+):(%d+)(.*)$')
    if n and tonumber(n) >= current then
      -- In the bucket in front (one TIME stepped back from, too: counted later, longer).
      packed = n .. ':' .. int(tonumber(c) + stored) .. rest
    else
      -- The first settle of this bucket: in front (newest first), and the buckets older
      -- than the lag (plus a second, for the rounding), which no ticket can subtract any
      -- more, are dropped from the end.
      local oldest = math.floor((s.now - KEEP_LAG - 1000) / 100)
      local kept = { int(current) .. ':' .. int(stored) }
      for bn, bc in string.gmatch(packed, '(%d+):(%d+)') do
        if tonumber(bn) < oldest then break end
        kept[#kept + 1] = bn .. ':' .. bc
      end
      packed = table.concat(kept, ' ')
    end
    hset(s, 'lag_buckets', packed)
  end
end

-- The stored sends settled in buckets from `from` on (a ticket leaves them in since_read).
local function settled_since(h, from)
  local total = 0
  for n, c in string.gmatch(h.lag_buckets or '', '(%d+):(%d+)') do
    if tonumber(n) < from then break end
    total = total + tonumber(c)
  end
  for f, v in pairs(h) do
    if string.sub(f, 1, 2) == 'r:' and num(string.sub(f, 3)) >= from then
      total = total + num(v)
    end
  end
  return total
end

-- Settle rows, triples (block id, stored, not_stored) from ARGV[first] on. A row takes out
-- of its block at most what the block still holds: a block that ended (pruned) or never
-- existed already gave its units back. Stored sends count either way: they may be stored.
local function settle_rows(s, first)
  local stored_total = 0
  for i = first, #ARGV - 2, 3 do
    local f = 'b:' .. ARGV[i]
    local stored, not_stored = num(ARGV[i + 1]), num(ARGV[i + 2])
    if s.h[f] then
      local units, lease_end = pair(s.h[f])
      local left = units - math.min(units, stored + not_stored)
      if left > 0 then
        hset(s, f, int(left) .. ':' .. int(lease_end))
      else
        hdel(s, { f })
      end
    end
    stored_total = stored_total + stored
  end
  complete(s, stored_total)
end

-- The view every reply carries, 17 integers (decoded in redis_port.rs):
-- epoch, version, grace_left_ms, state (0 never, 1 ok, 2 failed, 3 failed with the last good
-- read's backlog standing), backlog, send_disabled,
-- read_age_ms, paced_age_ms, streak, generation, paced, since_read, reserved, carried, replicas, reads_ok,
-- reads_failed.
local function view(h, now)
  local reserved, carried, replicas = sums(h, now)
  local state = 0
  if h.state == 'ok' then state = 1 elseif h.state == 'failed' then state = h.backlog and 3 or 2 end
  local age, paced_age = 0, 0
  if state ~= 0 then
    age = math.max(0, now - num(h.taken_ms))
    paced_age = math.max(0, now - num(h.paced_ms or h.taken_ms))
  end
  local backlog, disabled = 0, 0
  if state == 1 then backlog, disabled = num(h.backlog), num(h.send_disabled) end
  if state == 3 then backlog = num(h.backlog) end
  return {
    num(h.epoch), num(h.version), math.max(0, num(h.born) + GRACE - now), state, backlog,
    disabled, age, paced_age, num(h.streak), num(h.generation), num(h.paced), num(h.since_read), reserved, carried,
    replicas, num(h.reads_ok), num(h.reads_failed),
  }
end
