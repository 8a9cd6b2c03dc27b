-- claim: rules 1, 3, 5 and 6 in one atomic step (the claim algorithm of the store contract).
-- ARGV: 1 job, 2 slot, 3 kind, 4 runner, 5 token, 6 digest ('' for none), 7 lease ms,
-- 8 max attempts, 9 overlap ('skip' or 'allow'), 10 lateness limit ms, 11 retention ms,
-- 12 history size. Returns the outcome as JSON.
local job, slot_key = ARGV[1], ARGV[2]
local slot = tonumber(slot_key)
local kind, runner, token = ARGV[3], ARGV[4], ARGV[5]
local digest = ARGV[6]
local lease = tonumber(ARGV[7])
local max_attempts = tonumber(ARGV[8])
local overlap = ARGV[9]
local late_limit = tonumber(ARGV[10])
local retention = tonumber(ARGV[11])
local history_size = tonumber(ARGV[12])
local now, now_us = clock()

-- The job's next fence: max(previous + 1, the store's clock in µs), so that a promoted replica
-- (or a restarted Redis without persistence) that lost the last fences still hands out larger
-- ones, as long as the servers' clocks agree to within the failover time (see
-- baton::lease::next_fence). Written and returned as a string of digits.
local function next_fence()
  local previous = tonumber(redis.call('GET', KEYS[4]) or '0')
  local fence = math.max(previous + 1, now_us)
  redis.call('SET', KEYS[4], int(fence))
  return int(fence)
end

local function newest_slot()
  local top = redis.call('ZREVRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if #top == 0 then
    return nil
  end
  return tonumber(top[2])
end

local function new_attempt(number, reason, fence)
  local attempt = {
    attempt = number, runner = runner, token = token, reason = reason, fence = fence,
    started_at = now,
  }
  if digest ~= '' then
    attempt.digest = digest
  end
  return attempt
end

local function won(run)
  return cjson.encode({
    o = 'won', attempt = run.attempt, token = run.token, fence = run.fence,
    lease_end = run.lease_end,
  })
end

-- Step 3: keep history_size finished runs, but never one a late claim could still ask about.
local function trim()
  local running = redis.call('ZCARD', KEYS[3])
  local excess = redis.call('ZCARD', KEYS[2]) - running - history_size
  if excess <= 0 then
    return
  end
  local oldest = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. int(now - retention),
    'LIMIT', 0, excess + running)
  local deleted = 0
  for _, key in ipairs(oldest) do
    if deleted >= excess then
      break
    end
    if not redis.call('ZSCORE', KEYS[3], key) then
      redis.call('HDEL', KEYS[1], key)
      redis.call('ZREM', KEYS[2], key)
      deleted = deleted + 1
    end
  end
end

-- A paused job starts no attempt: only the same claim sent again gets its win back (it won
-- before the pause).
local run = load(slot_key)
if redis.call('EXISTS', KEYS[5]) == 1 then
  if run and run.status == 'running' and run.lease_end > now and run.token == token then
    return won(run)
  end
  return cjson.encode({ o = 'paused' })
end

-- Step 1: the slot has state.
if run then
  if run.status ~= 'running' then
    return cjson.encode({ o = 'finished', status = run.status })
  end
  if run.lease_end > now then
    if run.token == token then
      -- The same claim sent again (its answer was lost): it won already.
      return won(run)
    end
    return cjson.encode({
      o = 'running', attempt = run.attempt, runner = run.runner, lease_end = run.lease_end,
    })
  end
  -- Expired: a takeover, unless a newer run started first or the attempts are used up.
  local newest = newest_slot()
  end_expired_attempt(run)
  local deaths = 0
  for _, attempt in ipairs(run.attempts) do
    if attempt.outcome == 'died' then
      deaths = deaths + 1
    end
  end
  if (newest and newest > run.slot) or deaths >= max_attempts then
    run.status = 'interrupted'
    save(slot_key, run)
    return cjson.encode({ o = 'interrupted' })
  end
  local fence = next_fence()
  run.attempt = run.attempt + 1
  run.token = token
  run.runner = runner
  run.lease_end = now + lease
  run.released = false
  run.fence = fence
  table.insert(run.attempts, new_attempt(run.attempt, 'takeover', fence))
  save(slot_key, run)
  return won(run)
end

-- Step 2: no state.
if now - slot > late_limit then
  return cjson.encode({ o = 'late' })
end
local newest = newest_slot()
if newest and newest > slot then
  return cjson.encode({ o = 'superseded', newer_slot = newest })
end
if overlap == 'skip' then
  local live = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. int(now), '+inf')
  if #live > 0 then
    local blocking = nil
    for _, key in ipairs(live) do
      local s = tonumber(key)
      if blocking == nil or s < blocking then
        blocking = s
      end
    end
    return cjson.encode({ o = 'overlap', blocking_slot = blocking })
  end
end
-- Earlier runs whose lease ran out are interrupted: the newer run starts first.
for _, key in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', int(now))) do
  if tonumber(key) < slot then
    local old = load(key)
    if old then
      end_expired_attempt(old)
      old.status = 'interrupted'
      save(key, old)
    end
  end
end
local fence = next_fence()
local reason = kind
if reason == 'takeover' then
  reason = 'scheduled'
end
run = {
  job = job, slot = slot, status = 'running', attempt = 1, token = token, runner = runner,
  lease_end = now + lease, released = false, fence = fence,
  attempts = { new_attempt(1, reason, fence) },
}
save(slot_key, run)
redis.call('ZADD', KEYS[2], slot_key, slot_key)
trim()
return won(run)
