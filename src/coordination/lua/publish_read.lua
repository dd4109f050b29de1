-- Publish a read taken with a ticket (docs/fleet.md, step 4).
-- ARGV from 11: ticket epoch, ticket seq, completed_at_start, ok (1|0), backlog,
-- send_disabled (1|0), counts_in_streak (1|0), paced (1|0: not a read made again at the
-- ceiling), ends_lease (1|0). Reply: the view.
local s = preamble()
local h, now = s.h, s.now
local seq = num(ARGV[12])
local taken = h['t:' .. int(seq)]
-- A ticket of another epoch counted completions of another state; one no newer than the
-- last published is older news; one with no lease time was never issued here, or was
-- pruned: its read would already be older than reserve accepts.
if num(ARGV[11]) ~= num(h.epoch) or seq <= num(h.published_seq) or not taken then
  return view(h, now)
end
-- A read made again at the ceiling that shows no less than the read in force counted
-- forward (both bound the queue from above: the higher only by sends it counts twice, in
-- flight across it) is not published: it spends its ticket and ends its lease, nothing more.
if ARGV[18] ~= '1' and ARGV[14] == '1' and h.state == 'ok' and ARGV[16] ~= '1' and
    num(ARGV[15]) + math.max(0, num(h.completed_total) - num(ARGV[13])) >=
    num(h.backlog) + num(h.since_read) then
  if ARGV[19] == '1' and seq == num(h.ticket_seq) and num(h.lease_until) > now then
    hset(s, 'lease_until', int(now))
  end
  hset(s, 'published_seq', int(seq))
  local spent = {}
  for f in pairs(h) do
    if string.sub(f, 1, 2) == 't:' and num(string.sub(f, 3)) <= seq then spent[#spent + 1] = f end
  end
  hdel(s, spent)
  return view(h, now)
end
hset(s, 'generation', int(num(h.generation) + 1))
if ARGV[18] == '1' then
  hset(s, 'paced', int(num(h.paced) + 1))
  hset(s, 'paced_ms', taken)
end
-- The newest ticket's read is over: its lease guarded nothing more, and a read at the
-- ceiling may be taken as soon as it is due.
if ARGV[19] == '1' and seq == num(h.ticket_seq) and num(h.lease_until) > now then
  hset(s, 'lease_until', int(now))
end
hset(s, 'published_seq', int(seq))
hset(s, 'taken_ms', taken)
-- No ticket up to this one can be published any more.
local spent = {}
for f in pairs(h) do
  if string.sub(f, 1, 2) == 't:' and num(string.sub(f, 3)) <= seq then spent[#spent + 1] = f end
end
hdel(s, spent)
if ARGV[14] == '1' then
  hset(s, 'state', 'ok')
  hset(s, 'backlog', int(num(ARGV[15])))
  hset(s, 'send_disabled', ARGV[16] == '1' and '1' or '0')
  hset(s, 'streak', '0')
  hset(s, 'reads_ok', int(num(h.reads_ok) + 1))
  -- Only completions after the ticket are on top of this depth.
  hset(s, 'since_read', int(math.max(0, num(h.completed_total) - num(ARGV[13]))))
else
  -- A failed read leaves its time, and the last good read's backlog standing (with every
  -- send counted since, it still bounds the queue while the streak builds).
  hset(s, 'state', 'failed')
  hdel(s, { 'send_disabled' })
  if ARGV[17] == '1' then hset(s, 'streak', int(num(h.streak) + 1)) end
  hset(s, 'reads_failed', int(num(h.reads_failed) + 1))
end
return view(h, now)
