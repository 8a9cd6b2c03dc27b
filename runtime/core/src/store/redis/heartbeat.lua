-- heartbeat: rule 2. ARGV: 1 slot, 2 token, 3 lease ms. Returns the outcome as JSON. A
-- heartbeat after the lease ran out is refused by the store's clock, even before any takeover.
local run = load(ARGV[1])
if not run then
  return cjson.encode({ o = 'lost' })
end
local now = now_ms()
if not holds(run, ARGV[2]) or run.lease_end <= now then
  return cjson.encode({ o = 'lost', state = state(run) })
end
run.lease_end = now + tonumber(ARGV[3])
save(ARGV[1], run)
return cjson.encode({ o = 'renewed', lease_end = run.lease_end })
