-- Check-and-reserve (docs/fleet.md, step 1).
-- ARGV from 11: block_id, want, limit, divisor, lease_ms.
-- Reply: {kind, n, view...}; kind 0 granted (n units), 1 full (n = the estimate),
-- 2 disabled, 3 unknown (the read failed), 4 unread, 5 recovering, 6 new epoch.
local s = preamble()
local h, now = s.h, s.now
local function answer(kind, n)
  return { kind, n, unpack(view(h, now)) }
end
-- Its blocks and carry are reckoned against another state: grant nothing until it adopts
-- this one (its blocks' admissions then move to its carry).
if not s.matched then return answer(6, 0) end
-- A new epoch holds none of the sends admitted before it until every live replica has
-- called and reported its carry.
if now < num(h.born) + GRACE then return answer(5, 0) end
-- A read older than TTL + R may miss sends that left every other term.
if h.state == nil or now - num(h.taken_ms) > MAX_READ_AGE then return answer(4, 0) end
if h.state ~= 'ok' then return answer(3, 0) end
if h.send_disabled == '1' then return answer(2, 0) end
local reserved, carried = sums(h, now)
local estimate = num(h.backlog) + num(h.since_read) + reserved + carried
local limit = num(ARGV[13])
if estimate >= limit then return answer(1, estimate) end
-- A fraction of the room, never less than one: far from the ceiling a block spares many
-- round trips; near it blocks shrink to one unit, so the ceiling is exact.
local want, divisor = math.max(1, num(ARGV[12])), math.max(1, num(ARGV[14]))
local grant = math.max(1, math.min(want, math.floor((limit - estimate) / divisor)))
-- Ids are new for every ask, so a repeat is a retry whose first answer may have been
-- heard: its units stay held beside the new ones, under the later of the two leases
-- (held longer is the safe side; the lease end ends them).
local f = 'b:' .. ARGV[11]
local units, lease_end = pair(h[f])
hset(s, f, int(units + grant) .. ':' .. int(math.max(lease_end, now + num(ARGV[15]))))
return answer(0, grant)
