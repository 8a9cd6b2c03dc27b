-- operate: pause, resume or trigger a job, at the store's clock, in one atomic step with its
-- claims (the pause is the field p of the live hash, KEYS[1], which every claim reads). ARGV:
-- 1 job, 2 action (pause, resume or trigger), 3 host, 4 user, 5 reason ('' for none), 6 stop
-- ('1' or '0'), 7 the prefix of the job's lease keys. Answers { o = 'done', op = the operation }
-- or, for a trigger of a paused job, { o = 'paused', op = the pause in force }; the caller adds
-- the operation to the namespace's record.
local job, action, host, user, reason = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now = clock()
local pause = redis.call('HGET', KEYS[1], 'p')
if action == 'trigger' and pause then
  return cjson.encode({ o = 'paused', op = cjson.decode(pause) })
end
local names = { pause = 'paused', resume = 'resumed', trigger = 'triggered' }
local op = {
  job = job, action = names[action], at = now, host = host, user = user,
  stop = action == 'pause' and ARGV[6] == '1',
}
if reason ~= '' then
  op.reason = reason
end
if action == 'trigger' then
  op.slot = now
end
if action == 'pause' then
  redis.call('HSET', KEYS[1], 'p', cjson.encode(op))
  -- No lease key lives while the job is paused: claims must read the pause.
  local running = running_of(redis.call('HGET', KEYS[1], 'r'))
  for slot in pairs(running) do
    redis.call('DEL', ARGV[7] .. slot)
  end
elseif action == 'resume' then
  redis.call('HDEL', KEYS[1], 'p')
end
return cjson.encode({ o = 'done', op = op })
