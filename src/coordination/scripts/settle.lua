-- Sends from blocks finished (settle), or blocks give back headroom they will not use
-- (release: stored = 0). One call settles a batch: every block a replica's sends used in
-- one settle period, so a replica makes one round trip per period however many blocks.
-- ARGV: idle_ms, lag_ms, then one triple per block: block_id, stored, not_stored
-- Reply: 1.
local now = now_ms()
-- Pruned first: a block that already expired gave its headroom back then, so it must not
-- subtract it a second time here.
prune(now)
local taken, stored_total = 0, 0
for i = 3, #ARGV - 2, 3 do
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
-- Stored (or unknown-outcome) sends may be in the queue whether or not their block is still
-- live: they count on top of the last read until the next one.
if stored_total > 0 then
  redis.call('HINCRBY', COUNT, 'completed_total', int(stored_total))
  redis.call('HINCRBY', COUNT, 'since_read', int(stored_total))
end
-- A lagging admin plane: remember recent completions in 100 ms buckets (fields `r:N` of
-- COUNT), so the next lease can count those its read will not see yet. Buckets older than
-- the lag (plus a second) can no longer matter and are dropped here.
local lag = num(ARGV[2])
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
touch(ARGV[1])
return 1
