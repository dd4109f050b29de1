-- Take the read lease if nobody holds it (docs/fleet.md, step 4).
-- ARGV from 11: lease_ms.
-- Reply: {1, epoch, seq, completed_at_start, view...} with a ticket, {0, 0, 0, 0, view...}.
local s = preamble()
local h, now = s.h, s.now
if num(h.lease_until) > now then return { 0, 0, 0, 0, unpack(view(h, now)) } end
local seq = num(h.ticket_seq) + 1
hset(s, 'lease_holder', ARGV[7])
hset(s, 'lease_until', int(now + num(ARGV[OWN])))
hset(s, 'ticket_seq', int(seq))
-- The read shows nothing stored after this moment; published, this is the read's age.
hset(s, 't:' .. int(seq), int(now))
-- Completions settled within the lag may be missing from what the admin plane is about to
-- show: the ticket starts before them, so they stay in since_read after the publish.
local completed = num(h.completed_total)
if KEEP_LAG > 0 then
  completed = completed - settled_since(h, math.floor((now - KEEP_LAG) / 100))
end
return { 1, num(h.epoch), seq, math.max(0, completed), unpack(view(h, now)) }
