-- The fleet's shared read as it stands, with expired blocks pruned first so `reserved`
-- holds only live headroom.
-- ARGV: none for an onlooker (pruning only rewrites a field of an existing key, which keeps
--       its expiry); replica, member_ms, idle_ms, limit for a replica of the fleet (its
--       heartbeat, its reads), which is then counted among its replicas with its share
--       recorded (see reserve.lua).
-- Reply: the shared read (see read_reply).
local now = now_ms()
prune(now)
if ARGV[1] then
  join(now, ARGV[1], num(ARGV[2]), num(ARGV[3]))
  local read = read_reply(now)
  record_share(ARGV[1], read, num(ARGV[4]), num(ARGV[3]))
  return read
end
return read_reply(now)
