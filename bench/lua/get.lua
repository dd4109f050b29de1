-- wrk script for plain GETs (the admin-plane capacity reference): BENCH_AUTH, when set,
-- is sent as the Authorization header. Prints one line "BENCH_JSON {...}" at the end.
local auth = os.getenv("BENCH_AUTH")
if auth ~= nil and auth ~= "" then
  wrk.headers["Authorization"] = auth
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"secs":%.3f,"rps":%.1f,"p50_ms":%.3f,"p90_ms":%.3f,"p99_ms":%.3f,"max_ms":%.3f,"non_2xx_3xx":%d,"socket_errors":%d}\n',
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000,
    latency.max / 1000, e.status, e.connect + e.read + e.write + e.timeout))
end
