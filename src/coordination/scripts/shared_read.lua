-- The fleet's shared read as it stands, with expired blocks pruned first so `reserved`
-- holds only live headroom.
-- ARGV: none (pruning only rewrites a field of an existing key, which keeps its expiry)
-- Reply: the shared read (see read_reply).
local now = now_ms()
prune(now)
return read_reply(now)
