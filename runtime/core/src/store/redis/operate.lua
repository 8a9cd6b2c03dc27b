-- operate: pause, resume or trigger a job, at the store's clock, in one atomic step with its
-- claims (the pause is KEYS[5], which every claim reads). ARGV: 1 job, 2 action (pause, resume
-- or trigger), 3 host, 4 user, 5 reason ('' for none), 6 stop ('1' or '0'). Answers
-- { o = 'done', op = the operation } or, for a trigger of a paused job, { o = 'paused', op = the
-- pause in force }; the caller adds the operation to the namespace's record.
local job, action, host, user, reason = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now = now_ms()
local pause = redis.call('GET', KEYS[5])
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
  redis.call('SET', KEYS[5], cjson.encode(op))
elseif action == 'resume' then
  redis.call('DEL', KEYS[5])
end
return cjson.encode({ o = 'done', op = op })
