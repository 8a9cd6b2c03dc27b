-- finish and release: rule 4, and the hand-over. ARGV: 1 slot, 2 token, 3 what: 'release', or
-- the status to record ('success' or 'failed'). Returns the outcome as JSON.
local run = load(ARGV[1])
if not run then
  return cjson.encode({ o = 'refused' })
end
if not holds(run, ARGV[2]) then
  return cjson.encode({ o = 'refused', state = state(run) })
end
local now = now_ms()
local current = run.attempts[#run.attempts]
run.lease_end = now
if ARGV[3] == 'release' then
  -- A released lease stays released; the run waits for a backup's takeover claim.
  run.released = true
  current.outcome = 'handed-over'
else
  run.status = ARGV[3]
  current.outcome = ARGV[3]
end
current.ended_at = now
save(ARGV[1], run)
return cjson.encode({ o = 'accepted' })
