-- A drained replica leaves (docs/fleet.md, step 7): settle what is left, then drop its
-- blocks, its member, its terms and a read lease it holds, in one step, so no other replica sees the
-- units gone before the stored sends are counted.
-- ARGV from 11: triples block_id, stored, not_stored, as settle.lua. Reply: the view.
local s = preamble()
local h, now, replica = s.h, s.now, ARGV[7]
if s.matched then settle_rows(s, OWN) end
local mine = 'b:' .. replica .. ':'
-- Its terms go too: the lag it named no longer keeps the others' completions on top of
-- reads (it takes no more tickets).
local gone = { 'm:' .. replica, 'l:' .. replica, 'a:' .. replica }
for f in pairs(h) do
  if string.sub(f, 1, #mine) == mine then gone[#gone + 1] = f end
end
hdel(s, gone)
-- The carry stays until its hold ends: it counts sends (made alone, or from another
-- epoch's blocks) that no read may show yet, and leaving does not make a read show them.
-- The others need not wait out a lease for a read that may never be published.
if h.lease_holder == replica then hdel(s, { 'lease_holder', 'lease_until' }) end
return view(h, now)
