-- A replica that drained leaves the fleet: what its sends left is settled, then it no longer
-- counts in the fleet's size, holds no read lease, and its share is no longer withheld
-- from the others (it admits nothing more, and every send it admitted alone is in this
-- batch, counted on top of the read). One step, so no other replica sees the share gone
-- before the sends it covered are counted.
-- ARGV: replica, idle_ms, lag_ms, gone_ms (how long a call of the replica's still on its
--       way is ignored: see `has_left`), then one triple per block as settle.lua takes
-- Reply: 1.
local now = now_ms()
prune(now)
settle_blocks(now, num(ARGV[3]), 5)
local member = ARGV[1]
redis.call('ZREM', MEMBERS, member)
redis.call('HDEL', SHARES, member, member .. '#', member .. '^', member .. '~')
redis.call('HSET', SHARES, member .. '!', int(now + num(ARGV[4])))
-- A read lease it holds (a read ahead still on its way) is given back: the others would
-- wait a read's deadline for a read that may never be published, then use a stale one.
-- (lease_read.lua stores the holder's name; another's lease is not its to give back. Its
-- read, should it still be published, is ordered by its ticket like any other.)
if redis.call('GET', LEASE) == member then
  redis.call('DEL', LEASE)
end
-- The marks of replicas that left earlier, once expired.
for _, f in ipairs(redis.call('HKEYS', SHARES)) do
  if string.sub(f, -1) == '!' and num(redis.call('HGET', SHARES, f)) <= now then
    redis.call('HDEL', SHARES, f)
  end
end
touch(ARGV[2])
return 1
