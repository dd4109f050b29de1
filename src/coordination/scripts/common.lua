-- Prepended to every ledger script at build time (see ledger.rs). Every script is one
-- atomic step on one queue's keys, so no decision ever rests on a read made by an earlier
-- round trip. KEYS are always, in this order (one hash tag, so one cluster slot):
--   1 read         HASH   the fleet's last depth read and its streak
--   2 lease        STRING who reads the admin plane now (SET NX PX)
--   3 count        HASH   completed_total, since_read, reserved
--   4 blocks       ZSET   block id -> expiry (ms, Redis TIME)
--   5 block_sizes  HASH   block id -> headroom the block still holds
--   6 members      ZSET   replica -> its horizon: until when it counts in the fleet's size
--                         (ms); kept past it while its share is still held (see `held_from`)
--   7 shares       HASH   replica -> the largest share it may hold (withheld from the
--                         others); replica# -> its last share's number; replica^ -> the
--                         shares (number:share) of its calls since the one it acknowledged;
--                         replica~ -> its hold (see `held_from`)
-- READ also keeps t:N -> when ticket N's lease was taken, and taken_ms: that of the good
-- read published last (the earliest moment the admin plane may have been asked for it).
-- All time is this Redis's TIME: replicas' clocks are never compared.
local READ, LEASE, COUNT, BLOCKS, SIZES, MEMBERS, SHARES =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A missing field (false in Lua) or a non-number counts as 0.
local function num(v)
  return tonumber(v) or 0
end

-- Integers are written as plain digits: never let a double's formatting (1e+15) reach a
-- field that HINCRBY or the client must parse.
local function int(n)
  return string.format('%d', n)
end

local function at_least_zero(n)
  if n < 0 then return 0 end
  return n
end

-- Every key but the lease (which has its own PX) lives `idle_ms` after its last write, so
-- a deleted queue or deployment leaves nothing behind for ever.
local function touch(idle_ms)
  for _, k in ipairs({READ, COUNT, BLOCKS, SIZES, MEMBERS, SHARES}) do
    redis.call('PEXPIRE', k, idle_ms)
  end
end

-- Blocks whose lease ran out (a replica that died or stopped asking) give their headroom
-- back: their sizes leave `reserved`.
local function prune(now)
  local expired = redis.call('ZRANGEBYSCORE', BLOCKS, '-inf', now)
  if #expired == 0 then return end
  local freed = 0
  for _, id in ipairs(expired) do
    freed = freed + num(redis.call('HGET', SIZES, id))
    redis.call('HDEL', SIZES, id)
  end
  redis.call('ZREMRANGEBYSCORE', BLOCKS, '-inf', now)
  local reserved = at_least_zero(num(redis.call('HGET', COUNT, 'reserved')) - freed)
  redis.call('HSET', COUNT, 'reserved', int(reserved))
end

-- Member `m` still has its share withheld from the others while its horizon is above this.
-- A member past its horizon (forgotten: it no longer counts in the fleet's size) may have
-- admitted its share alone until just before it, and those sends may be stored up to its
-- hold later (a send's deadline) and show in the admin plane's counts later still (its
-- lag, also in the hold): only a read taken at or after horizon + hold shows them all,
-- and until such a read is the one published, the share stays held. (A read taken earlier
-- may be the one reserved against for up to a TTL after it: releasing the share at the
-- horizon let the others take that room a second time.) The hold is the member's own, as
-- `join` recorded it (m~), or the caller's `hold_ms` if longer (or none was recorded).
local function held_from(now, m, hold_ms)
  local hold = math.max(hold_ms, num(redis.call('HGET', SHARES, m .. '~')))
  local from = num(redis.call('HGET', READ, 'taken_ms')) - hold
  if from > now then return now end -- a clock stepped back: live members stay held
  return from
end

-- Outcomes of blocks, as triples block_id, stored, not_stored in ARGV from `first` on:
-- only what a block still holds leaves `reserved`; stored (or unknown-outcome) sends count
-- on top of the read whether or not their block is still live (see settle.lua).
local function settle_blocks(now, lag, first)
  local taken, stored_total = 0, 0
  for i = first, #ARGV - 2, 3 do
    local id, stored, not_stored = ARGV[i], num(ARGV[i + 1]), num(ARGV[i + 2])
    local held = num(redis.call('HGET', SIZES, id))
    local take = math.min(held, stored + not_stored)
    if take > 0 then
      if held - take > 0 then
        redis.call('HSET', SIZES, id, int(held - take))
      else
        redis.call('HDEL', SIZES, id)
        redis.call('ZREM', BLOCKS, id)
      end
      taken = taken + take
    end
    stored_total = stored_total + stored
  end
  if taken > 0 then
    local reserved = at_least_zero(num(redis.call('HGET', COUNT, 'reserved')) - taken)
    redis.call('HSET', COUNT, 'reserved', int(reserved))
  end
  if stored_total > 0 then
    redis.call('HINCRBY', COUNT, 'completed_total', int(stored_total))
    redis.call('HINCRBY', COUNT, 'since_read', int(stored_total))
  end
  -- A lagging admin plane: remember recent completions in 100 ms buckets (fields `r:N` of
  -- COUNT), so the next lease can count those its read will not see yet. Buckets older
  -- than the lag (plus a second) can no longer matter and are dropped here.
  if lag > 0 then
    if stored_total > 0 then
      redis.call('HINCRBY', COUNT, 'r:' .. int(math.floor(now / 100)), int(stored_total))
    end
    local oldest = math.floor((now - lag - 1000) / 100)
    local fields = redis.call('HKEYS', COUNT)
    for _, f in ipairs(fields) do
      if string.sub(f, 1, 2) == 'r:' and num(string.sub(f, 3)) < oldest then
        redis.call('HDEL', COUNT, f)
      end
    end
  end
end

-- A replica that left (leave.lua) is not heard from again: SHARES replica! -> until when a
-- call of its that was still on its way is ignored (it would count it in the fleet again,
-- its share withheld). Expired, the mark goes.
local function has_left(now, member)
  local until_ms = redis.call('HGET', SHARES, member .. '!')
  if not until_ms then return false end
  if num(until_ms) > now then return true end
  redis.call('HDEL', SHARES, member .. '!')
  return false
end

-- Replica `member` counts in the fleet's size for `member_ms` from now, its hold
-- (`hold_ms`: its send deadline and lag) recorded beside its share. Members whose share is
-- no longer held (see `held_from`; only one past its horizon can be) leave, with what is
-- recorded for them. A replica that left is not joined again (see `has_left`).
local function join(now, member, member_ms, idle_ms, hold_ms)
  local past = redis.call('ZRANGEBYSCORE', MEMBERS, '-inf', int(now), 'WITHSCORES')
  for i = 1, #past, 2 do
    local m = past[i]
    if num(past[i + 1]) <= held_from(now, m, hold_ms) then
      redis.call('HDEL', SHARES, m, m .. '#', m .. '^', m .. '~')
      redis.call('ZREM', MEMBERS, m)
    end
  end
  if has_left(now, member) then return end
  redis.call('ZADD', MEMBERS, int(now + member_ms), member)
  redis.call('HSET', SHARES, member .. '~', int(hold_ms))
  redis.call('PEXPIRE', MEMBERS, idle_ms)
  redis.call('PEXPIRE', SHARES, idle_ms)
end

-- The shared read as the client decodes it, thirteen integers:
-- state (0 never, 1 ok, 2 failed), backlog, send_disabled, age_ms, streak, generation,
-- since_read, reserved, reads_ok, reads_failed, replicas (members still counted), and the
-- asking replica's share and its sequence number (0, 0 unless the script recorded one).
local function read_reply(now)
  local r = redis.call('HMGET', READ, 'state', 'backlog', 'send_disabled', 'at_ms',
    'streak', 'generation', 'reads_ok', 'reads_failed')
  local c = redis.call('HMGET', COUNT, 'since_read', 'reserved')
  local state = 0
  if r[1] == 'ok' then state = 1 elseif r[1] == 'failed' then state = 2 end
  local age = 0
  if r[4] then age = at_least_zero(now - num(r[4])) end
  local replicas = redis.call('ZCOUNT', MEMBERS, '(' .. now, '+inf')
  return {state, num(r[2]), num(r[3]), age, num(r[5]), num(r[6]), num(c[1]), num(c[2]),
    num(r[7]), num(r[8]), replicas, 0, 0}
end

-- The shares recorded for every replica but `member` whose share is held (each one still
-- counted in the fleet's size, and those forgotten that a read may not show yet: see
-- `held_from`): what each may admit, or may have admitted, alone. Never reserved by anyone
-- else.
local function others_shares(now, member, hold_ms)
  local all = redis.call('ZRANGE', MEMBERS, 0, -1, 'WITHSCORES')
  local sum = 0
  for i = 1, #all, 2 do
    local m = all[i]
    if m ~= member and num(all[i + 1]) > held_from(now, m, hold_ms) then
      sum = sum + num(redis.call('HGET', SHARES, m))
    end
  end
  return sum
end

-- Record what replica `member`, answered with `read`, may admit alone should it turn local
-- before it is heard from again: a quarter of its equal part (1/replicas) of the room left
-- beside every other replica's share (`others`), rounded down, so the blocks and the shares
-- together never pass the ceiling, and the shares held for the others never take more than
-- a quarter of the room from a replica that asks (one that just joined among them too). The
-- reply carries it with a sequence number (its seat keeps the newest). Without a good read
-- there is nothing new to divide: the share stays as it was.
-- `seq` is the replica's own (its calls' numbers: they go on rising whatever Redis forgets,
-- a member or everything at a restart); nil for a block id without one. `acked` is the
-- number of the share the replica last heard of (0: none yet, or not said).
local function record_share(member, read, limit, others, idle_ms, seq, acked)
  -- A replica that left holds no share (join did not count it either).
  if redis.call('HEXISTS', SHARES, member .. '!') == 1 then return end
  if read[1] ~= 1 or read[3] == 1 then
    read[12] = num(redis.call('HGET', SHARES, member))
    read[13] = num(redis.call('HGET', SHARES, member .. '#'))
    return
  end
  local room = limit - (read[2] + read[7] + read[8]) - others
  local share = 0
  if room > 0 then
    share = math.floor(room / (4 * math.max(1, read[11])))
  end
  local n = seq
  if n then
    redis.call('HSET', SHARES, member .. '#', int(n))
  else
    n = redis.call('HINCRBY', SHARES, member .. '#', 1)
  end
  -- The replica may hold this share, or that of any call since the one it acknowledged
  -- (their answers may be lost or on their way): the largest of them is withheld from the
  -- others (the `member` field, which `others_shares` reads). Bounded by its calls between
  -- two answers it saw.
  local hold = share
  local kept = {}
  if acked and acked > 0 then
    local list = redis.call('HGET', SHARES, member .. '^')
    if list then
      for q, sh in string.gmatch(list, '(%d+):(%d+)') do
        if tonumber(q) >= acked then
          kept[#kept + 1] = q .. ':' .. sh
          if tonumber(sh) > hold then hold = tonumber(sh) end
        end
      end
    end
  end
  kept[#kept + 1] = int(n) .. ':' .. int(share)
  redis.call('HSET', SHARES, member, int(hold), member .. '^', table.concat(kept, ' '))
  read[12] = share
  read[13] = n
  redis.call('PEXPIRE', SHARES, idle_ms)
end
