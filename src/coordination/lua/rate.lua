-- A tenant's rate quota across the fleet (docs/fairness.md, "Quotas in a fleet"); nothing of
-- the ceiling's ledger. One GCRA: KEYS[1] holds its theoretical arrival time (TAT), whole
-- microseconds of Redis's clock (one clock for every replica, whatever theirs say).
-- ARGV: 1 the emission interval (ns), 2 the burst (units), 3 units wanted (0: only look).
-- Grants as many of the wanted units as conform now, never past the burst, advances the TAT
-- by them, and answers {granted, microseconds until one more unit conforms}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1]) / 1000
local tolerance = interval * tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local stored = redis.call('GET', KEYS[1])
local tat = stored and tonumber(stored) or now
-- A TAT in the past is a full bucket: idle time is not saved up past the burst.
if tat < now then tat = now end
-- The tolerance's last unit conforms exactly: a hair of float error is not a refusal.
local fits = math.floor((now + tolerance - tat) / interval + 1e-9)
local granted = math.max(0, math.min(want, fits))
tat = tat + granted * interval
local wait = math.max(0, tat + interval - tolerance - now)
-- Stored rounded up (a replica is never granted a fraction early), and only while it says
-- more than a full bucket: past the TAT the key is gone, which means the same.
local ahead = math.ceil(tat - now)
if ahead > 0 then
  redis.call('SET', KEYS[1], string.format('%.0f', now + ahead), 'PX', math.ceil(ahead / 1000) + 1)
end
return {granted, math.ceil(wait)}
