-- The state as it is, for an onlooker: no preamble, no writes, nothing made or pruned.
-- Reply: nil if the hash is missing, else the view (live sums filtered by time).
local now = clock()
local h = load()
-- Without an epoch it is not a state: the next call makes one.
if num(h.epoch) <= 0 then return false end
return view(h, now)
