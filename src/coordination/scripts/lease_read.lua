-- Become the fleet's reader of the admin plane for one lease.
-- ARGV: owner, lease_ms, idle_ms
-- Reply: {1, completed_total, ticket_seq} for the one caller that got the lease, else {0, 0, 0}.
if not redis.call('SET', LEASE, ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, 0, 0}
end
-- The completions counted so far are taken in the same step as the lease: whatever
-- completes after this point is added on top of the depth the reader is about to see (a
-- completion the admin plane already counts is then counted twice: the safe side).
local seq = redis.call('HINCRBY', READ, 'ticket_seq', 1)
touch(ARGV[3])
return {1, num(redis.call('HGET', COUNT, 'completed_total')), seq}
