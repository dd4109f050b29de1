-- Atomic check-and-reserve of headroom under the ceiling.
-- ARGV: block_id, want (>= 1), limit, lease_ms, share_divisor (>= 1), idle_ms, member_ms,
--       acked (the number of the share the replica last heard of; 0 or absent: none),
--       hold_ms (how long past this replica's horizon its sends may be missing from a
--       read: a send's deadline and the admin plane's lag; recorded for it, and a
--       forgotten member is held for the longer of its own and this: see `held_from`)
-- Reply: {kind, n, <shared read>}: kind 0 granted (n = granted), 1 full (n = estimate, the
--        other replicas' shares included), 2 disabled, 3 unknown (no good read: the caller
--        fails open or closed). The read carries the asking replica's new share.
local now = now_ms()
prune(now)
local limit = num(ARGV[3])
local idle_ms, member_ms = num(ARGV[6]), num(ARGV[7])
-- The replica asking counts in the fleet's size, whatever the answer. Block ids are
-- `{replica}:{n}`; one without a `:` belongs to the anonymous replica ''.
local member = string.match(ARGV[1], '^(.*):[^:]*$') or ''
-- The `{n}` of the id numbers this replica's calls: its share's sequence number.
local seq = tonumber(string.match(ARGV[1], ':(%d+)$'))
local acked = tonumber(ARGV[8])
local hold_ms = num(ARGV[9])
join(now, member, member_ms, idle_ms, hold_ms)
local read = read_reply(now)
if read[1] ~= 1 then
  record_share(member, read, limit, 0, idle_ms, seq, acked)
  return {3, 0, unpack(read)}
end
if read[3] == 1 then
  record_share(member, read, limit, 0, idle_ms, seq, acked)
  return {2, 0, unpack(read)}
end
-- backlog + completions since the read + headroom every replica holds + what each other
-- replica may admit alone (its share: it may be cut off from Redis right now).
local others = others_shares(now, member, hold_ms)
local estimate = read[2] + read[7] + read[8] + others
if estimate >= limit then
  record_share(member, read, limit, others, idle_ms, seq, acked)
  return {1, estimate, unpack(read)}
end
-- A fraction of what remains, never less than one: far from the ceiling a block spares
-- many round trips; near it the blocks shrink to one send each, so the ceiling is exact.
local share = math.max(1, math.floor((limit - estimate) / math.max(1, num(ARGV[5]))))
local grant = math.max(1, math.min(num(ARGV[2]), share))
-- The same block asking again grows and lives one more lease from now.
redis.call('HINCRBY', SIZES, ARGV[1], int(grant))
redis.call('ZADD', BLOCKS, int(now + num(ARGV[4])), ARGV[1])
read[8] = read[8] + grant
redis.call('HSET', COUNT, 'reserved', int(read[8]))
-- Its own share comes out of what is left after the grant.
record_share(member, read, limit, others, idle_ms, seq, acked)
touch(idle_ms)
return {0, grant, unpack(read)}
