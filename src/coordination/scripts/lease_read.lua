-- Become the fleet's reader of the admin plane for one lease.
-- ARGV: owner, lease_ms, idle_ms, lag_ms
-- Reply: {1, completed_total, ticket_seq} for the one caller that got the lease, else {0, 0, 0}.
if not redis.call('SET', LEASE, ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, 0, 0}
end
-- The completions counted so far are taken in the same step as the lease: whatever
-- completes after this point is added on top of the depth the reader is about to see (a
-- completion the admin plane already counts is then counted twice: the safe side).
local seq = redis.call('HINCRBY', READ, 'ticket_seq', 1)
-- When this read may first have asked the admin plane: it shows nothing stored later (see
-- `held_from`). Dropped when this ticket, or a newer one, is published.
local now = now_ms()
redis.call('HSET', READ, 't:' .. int(seq), int(now))
touch(ARGV[3])
local completed = num(redis.call('HGET', COUNT, 'completed_total'))
-- With a lagging admin plane, completions settled within the lag before now may be
-- missing from the count the reader is about to see: start the ticket before them.
local lag = num(ARGV[4])
if lag > 0 then
  local from = math.floor((now - lag) / 100)
  local all = redis.call('HGETALL', COUNT)
  for i = 1, #all, 2 do
    local f = all[i]
    if string.sub(f, 1, 2) == 'r:' and num(string.sub(f, 3)) >= from then
      completed = completed - num(all[i + 1])
    end
  end
end
return {1, at_least_zero(completed), seq}
