-- Sends from blocks finished (settle), or blocks give back headroom they will not use
-- (release: stored = 0). One call settles a batch: every block a replica's sends used in
-- one settle period, so a replica makes one round trip per period however many blocks.
-- ARGV: idle_ms, lag_ms, then one triple per block: block_id, stored, not_stored
-- Reply: 1.
local now = now_ms()
-- Pruned first: a block that already expired gave its headroom back then, so it must not
-- subtract it a second time here.
prune(now)
settle_blocks(now, num(ARGV[2]), 3)
touch(ARGV[1])
return 1
