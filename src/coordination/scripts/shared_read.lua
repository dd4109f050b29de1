-- The fleet's shared read as it stands, with expired blocks pruned first so `reserved`
-- holds only live headroom.
-- ARGV: none for an onlooker (pruning only rewrites a field of an existing key, which keeps
--       its expiry); replica, member_ms, idle_ms, limit, seq, acked, hold_ms for a replica of
--       the fleet (its heartbeat, its reads), which is then counted among its replicas with
--       its share and hold recorded (see reserve.lua).
-- Reply: the shared read (see read_reply).
local now = now_ms()
prune(now)
if ARGV[1] then
  local limit, idle_ms, hold_ms = num(ARGV[4]), num(ARGV[3]), num(ARGV[7])
  join(now, ARGV[1], num(ARGV[2]), idle_ms, hold_ms)
  local read = read_reply(now)
  record_share(ARGV[1], read, limit, others_shares(now, ARGV[1], hold_ms), idle_ms,
    tonumber(ARGV[5]), tonumber(ARGV[6]))
  return read
end
return read_reply(now)
