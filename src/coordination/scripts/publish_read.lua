-- Publish one read's outcome for every replica.
-- ARGV: ticket_seq, completed_at_start, ok (1|0), backlog, send_disabled (1|0),
--       counts_in_streak (1|0), idle_ms
-- Reply: the shared read (see read_reply).
local now = now_ms()
local seq = tonumber(ARGV[1]) or 0
-- A ticket no newer than the one already published is older news (a slow reader whose
-- lease ran out while another read and published): it must not overwrite a newer depth,
-- nor move the streak, nor be published twice.
if seq <= num(redis.call('HGET', READ, 'published_seq')) then
  return read_reply(now)
end
redis.call('HSET', READ, 'published_seq', int(seq), 'at_ms', int(now))
redis.call('HINCRBY', READ, 'generation', 1)
-- When this read's lease was taken; no ticket up to this one can be published any more.
local taken = redis.call('HGET', READ, 't:' .. int(seq))
for _, f in ipairs(redis.call('HKEYS', READ)) do
  if string.sub(f, 1, 2) == 't:' and num(string.sub(f, 3)) <= seq then
    redis.call('HDEL', READ, f)
  end
end
if ARGV[3] == '1' then
  -- The shares of forgotten replicas are held against this read's lease time (see
  -- `held_from`); unknown (the keys expired meanwhile), every one stays held.
  if taken then
    redis.call('HSET', READ, 'taken_ms', taken)
  else
    redis.call('HDEL', READ, 'taken_ms')
  end
  -- Only completions after the ticket are on top of this depth.
  local since = at_least_zero(num(redis.call('HGET', COUNT, 'completed_total')) - num(ARGV[2]))
  redis.call('HSET', READ, 'state', 'ok', 'backlog', ARGV[4], 'send_disabled', ARGV[5],
    'streak', '0')
  redis.call('HINCRBY', READ, 'reads_ok', 1)
  redis.call('HSET', COUNT, 'since_read', int(since))
else
  -- As the local gate does: a failed read leaves no depth behind, only its time.
  redis.call('HSET', READ, 'state', 'failed')
  redis.call('HDEL', READ, 'backlog', 'send_disabled')
  if ARGV[6] == '1' then
    redis.call('HINCRBY', READ, 'streak', 1)
  end
  redis.call('HINCRBY', READ, 'reads_failed', 1)
end
touch(ARGV[7])
return read_reply(now)
