-- The tenants' exchange (docs/fairness.md, "In a fleet"); nothing of the ceiling's ledger.
-- KEYS[1]: the queue's tenants hash, one field per replica = "<until_ms>|<its counts>".
-- ARGV: 1 replica, 2 keep_ms, 3 its counts (JSON, stored as given).
-- Keeps the caller's counts until now + keep, drops every field past its time, and answers
-- the other replicas' counts as stored; summing them is the replica's (shares.rs).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- PEXPIRE 0 would delete the hash at once.
local keep = math.max(1, tonumber(ARGV[2]) or 1)
redis.call('HSET', KEYS[1], ARGV[1], (now + keep) .. '|' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], keep)
local others = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local field, value = all[i], all[i + 1]
  if field ~= ARGV[1] then
    local bar = string.find(value, '|', 1, true)
    local until_ms = bar and tonumber(string.sub(value, 1, bar - 1))
    if until_ms and until_ms > now then
      others[#others + 1] = string.sub(value, bar + 1)
    else
      redis.call('HDEL', KEYS[1], field)
    end
  end
end
return others
