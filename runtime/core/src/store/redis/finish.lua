-- finish and release: rule 4, and the hand-over. KEYS: 1 the live hash, 2 the slot's lease key.
-- ARGV: 1 slot, 2 token, 3 what: 'release', or the status to record ('success' or 'failed').
-- Answers 'accepted', 'refused' or 'refused <state>'.
local live = redis.call('HMGET', KEYS[1], ARGV[1], 'r')
if not live[1] then
  return 'refused'
end
local run = parse(live[1])
if not holds(run, ARGV[2]) then
  return 'refused ' .. state(run)
end
local now = clock()
run.lease_end = now
local r
if ARGV[3] == 'release' then
  -- A released lease stays released; the run waits for a backup's takeover claim.
  run.released = true
  end_attempt(run, 'handed-over', now)
  r = set_running(live[2], ARGV[1], now)
else
  run.status = ARGV[3]
  end_attempt(run, ARGV[3], now)
  r = set_running(live[2], ARGV[1], nil)
end
redis.call('HSET', KEYS[1], ARGV[1], format(run), 'r', r)
redis.call('DEL', KEYS[2])
return 'accepted'
