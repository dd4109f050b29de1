-- Outcomes of the caller's blocks (docs/fleet.md, step 3).
-- ARGV from 11: triples block_id, stored, not_stored. Reply: the view.
local s = preamble()
-- Rows of another epoch are dropped: those blocks are not in this state, and their sends
-- are in the caller's carry.
if s.matched then settle_rows(s, OWN) end
return view(s.h, s.now)
