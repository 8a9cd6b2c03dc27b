-- heartbeat: rule 2. ARGV: 1 slot, 2 token, 3 lease ms. Returns the outcome as JSON.
local run = load(ARGV[1])
if not run then
  return cjson.encode({ o = 'lost' })
end
if not holds(run, ARGV[2]) then
  return cjson.encode({ o = 'lost', state = state(run) })
end
run.lease_end = now_ms() + tonumber(ARGV[3])
save(ARGV[1], run)
return cjson.encode({ o = 'renewed', lease_end = run.lease_end })
