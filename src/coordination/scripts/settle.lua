-- Sends from a block finished (settle), or a block gives back headroom it will not use
-- (release: stored = 0).
-- ARGV: block_id, stored, not_stored, idle_ms, lag_ms
-- Reply: 1.
local now = now_ms()
-- Pruned first: a block that already expired gave its headroom back then, so it must not
-- subtract it a second time here.
prune(now)
local stored, not_stored = num(ARGV[2]), num(ARGV[3])
local held = num(redis.call('HGET', SIZES, ARGV[1]))
local take = math.min(held, stored + not_stored)
if take > 0 then
  if held - take > 0 then
    redis.call('HSET', SIZES, ARGV[1], int(held - take))
  else
    redis.call('HDEL', SIZES, ARGV[1])
    redis.call('ZREM', BLOCKS, ARGV[1])
  end
  local reserved = at_least_zero(num(redis.call('HGET', COUNT, 'reserved')) - take)
  redis.call('HSET', COUNT, 'reserved', int(reserved))
end
-- Stored (or unknown-outcome) sends may be in the queue whether or not their block is still
-- live: they count on top of the last read until the next one.
if stored > 0 then
  redis.call('HINCRBY', COUNT, 'completed_total', int(stored))
  redis.call('HINCRBY', COUNT, 'since_read', int(stored))
end
-- A lagging admin plane: remember recent completions in 100 ms buckets (fields `r:N` of
-- COUNT), so the next lease can count those its read will not see yet. Buckets older than
-- the lag (plus a second) can no longer matter and are dropped here.
local lag = num(ARGV[5])
if lag > 0 then
  if stored > 0 then
    redis.call('HINCRBY', COUNT, 'r:' .. int(math.floor(now / 100)), int(stored))
  end
  local oldest = math.floor((now - lag - 1000) / 100)
  local fields = redis.call('HKEYS', COUNT)
  for _, f in ipairs(fields) do
    if string.sub(f, 1, 2) == 'r:' and num(string.sub(f, 3)) < oldest then
      redis.call('HDEL', COUNT, f)
    end
  end
end
touch(ARGV[4])
return 1
