-- wrk script for the rejection-path comparison: POST the same 1 KB JSON body the other
-- benchmarks send, with Content-Type and (when BENCH_TOKEN is set) a bearer token.
-- At the end it prints one line "BENCH_JSON {...}" with the numbers ./bench/run.sh keeps.
local token = os.getenv("BENCH_TOKEN")
local size = tonumber(os.getenv("BENCH_BODY_BYTES") or "1024")
local head, tail = '{"bench":true,"pad":"', '"}'

-- The 1-minute load average, noted when wrk starts and when it is done (shared machine).
local function loadavg()
  local f = io.open("/proc/loadavg", "r")
  if f == nil then return -1 end
  local v = tonumber(f:read("*l"):match("^(%S+)")) or -1
  f:close()
  return v
end
local load_before = loadavg()

wrk.method = "POST"
wrk.body = head .. string.rep("x", size - #head - #tail) .. tail
wrk.headers["Content-Type"] = "application/json"
if token ~= nil and token ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. token
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"secs":%.3f,"rps":%.1f,"p50_ms":%.3f,"p90_ms":%.3f,"p99_ms":%.3f,"max_ms":%.3f,"non_2xx_3xx":%d,"socket_errors":%d,"loadavg_before":%.2f,"loadavg_after":%.2f}\n',
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000,
    latency.max / 1000, e.status, e.connect + e.read + e.write + e.timeout, load_before, loadavg()))
end
