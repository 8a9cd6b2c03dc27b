-- heartbeat: rule 2. KEYS: 1 the live hash, 2 the slot's lease key. ARGV: 1 slot, 2 token,
-- 3 lease ms. Answers 'renewed <lease end>', 'lost' or 'lost <state>'. A heartbeat after the
-- lease ran out is refused by the store's clock, even before any takeover.
local live = redis.call('HMGET', KEYS[1], ARGV[1], 'r', 'p')
if not live[1] then
  return 'lost'
end
local run = parse(live[1])
local now = clock()
if not holds(run, ARGV[2]) or run.lease_end <= now then
  return 'lost ' .. state(run)
end
run.lease_end = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], format(run), 'r', set_running(live[2], ARGV[1], run.lease_end))
if not live[3] then
  hold(run)
end
return 'renewed ' .. int(run.lease_end)
