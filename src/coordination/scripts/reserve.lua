-- Atomic check-and-reserve of headroom under the ceiling.
-- ARGV: block_id, want (>= 1), limit, lease_ms, share_divisor (>= 1), idle_ms
-- Reply: {kind, n, <shared read>}: kind 0 granted (n = granted), 1 full (n = estimate),
--        2 disabled, 3 unknown (no good read: the caller fails open or closed).
local now = now_ms()
prune(now)
local read = read_reply(now)
if read[1] ~= 1 then
  return {3, 0, unpack(read)}
end
if read[3] == 1 then
  return {2, 0, unpack(read)}
end
-- backlog + completions since the read + headroom every replica holds.
local estimate = read[2] + read[7] + read[8]
local limit = num(ARGV[3])
if estimate >= limit then
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
touch(ARGV[6])
return {0, grant, unpack(read)}
