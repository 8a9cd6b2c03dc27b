-- claim: rules 1, 3, 5 and 6 in one atomic step (the claim algorithm of the store contract).
-- KEYS: 1 the live hash, 2 the slot's lease key, 3 slots (a sorted set of every slot with state,
-- for the history and its trim). ARGV: 1 job, 2 slot, 3 kind, 4 runner (a JSON string), 5 token,
-- 6 digest (a JSON string, '' for none), 7 lease ms, 8 max attempts, 9 overlap ('skip' or
-- 'allow'), 10 lateness limit ms, 11 retention ms, 12 history size. Answers 'won <attempt>
-- <lease end> <fence>', 'running <attempt> <lease end> <fence> <runner>', 'overlap <slot>',
-- 'late', 'superseded <slot>', 'finished <status>', 'interrupted' or 'paused'.
local slot_key, token = ARGV[2], ARGV[5]

-- Step 1, answered from the lease key: the slot's lease is alive (so the job is not paused).
local held = redis.call('GET', KEYS[2])
if held then
  local rest = string.sub(held, #token + 2)
  if string.sub(held, 1, #token + 1) == token .. ' ' then
    -- The same claim sent again (its answer was lost): it won already.
    return 'won ' .. rest
  end
  return 'running ' .. rest
end

local slot = tonumber(slot_key)
local kind, runner = ARGV[3], ARGV[4]
local digest = ARGV[6]
local lease = tonumber(ARGV[7])
local now, now_us = clock()
local live = redis.call('HMGET', KEYS[1], slot_key, 'n', 'f', 'p', 'r', 'c')
local raw, newest, r = live[1], tonumber(live[2]), live[5]

-- The job's next fence: max(previous + 1, the store's clock in µs), so that a promoted replica
-- (or a restarted Redis without persistence) that lost the last fences still hands out larger
-- ones, as long as the servers' clocks agree to within the failover time (see
-- baton::lease::next_fence). A string of digits.
local function next_fence()
  return int(math.max(tonumber(live[3] or '0') + 1, now_us))
end

local function won(run)
  return 'won ' .. int(run.attempt) .. ' ' .. int(run.lease_end) .. ' ' .. run.fence
end

-- Starts attempt `run.attempt` of `run` for this claim: its head and its attempt's text.
local function start(run, reason)
  run.token, run.runner, run.lease_end, run.released = token, runner, now + lease, false
  run.fence = next_fence()
  local attempt = '{"attempt":' .. int(run.attempt) .. ',"runner":' .. runner .. ',"token":"'
    .. token .. '","reason":"' .. reason .. '","fence":"' .. run.fence .. '","started_at":'
    .. int(now)
  if digest ~= '' then
    attempt = attempt .. ',"digest":' .. digest
  end
  if run.attempts == '' then
    run.attempts = '[' .. attempt .. '}]'
  else
    run.attempts = string.sub(run.attempts, 1, -2) .. ',' .. attempt .. '}]'
  end
end

local run = raw and parse(raw)

-- A paused job starts no attempt: only the same claim sent again gets its win back (it won
-- before the pause).
if live[4] then
  if run and run.status == 'running' and run.lease_end > now and run.token == token then
    return won(run)
  end
  return 'paused'
end

-- Step 1: the slot has state.
if run then
  if run.status ~= 'running' then
    return 'finished ' .. run.status
  end
  if run.lease_end > now then
    if run.token == token then
      return won(run)
    end
    return 'running ' .. string.sub(lease_value(run), #run.token + 2)
  end
  -- Expired: a takeover, unless a newer run started first or the attempts are used up.
  end_expired_attempt(run)
  if (newest and newest > slot) or run.deaths >= tonumber(ARGV[8]) then
    run.status = 'interrupted'
    redis.call('HSET', KEYS[1], slot_key, format(run), 'r', set_running(r, slot_key, nil))
    return 'interrupted'
  end
  run.attempt = run.attempt + 1
  start(run, 'takeover')
  redis.call('HSET', KEYS[1], slot_key, format(run), 'f', run.fence,
    'r', set_running(r, slot_key, run.lease_end))
  hold(run)
  return won(run)
end

-- Step 2: no state.
if now - slot > tonumber(ARGV[10]) then
  return 'late'
end
if newest and newest > slot then
  return 'superseded ' .. int(newest)
end
local running = running_of(r)
if ARGV[9] == 'skip' then
  local blocking = nil
  for s, lease_end in pairs(running) do
    local n = tonumber(s)
    if lease_end > now and (blocking == nil or n < blocking) then
      blocking = n
    end
  end
  if blocking then
    return 'overlap ' .. int(blocking)
  end
end
-- Earlier runs whose lease ran out are interrupted: the newer run starts first.
local interrupted = {}
for s, lease_end in pairs(running) do
  if lease_end <= now and tonumber(s) < slot then
    local old_raw = redis.call('HGET', KEYS[1], s)
    if old_raw then
      local old = parse(old_raw)
      end_expired_attempt(old)
      old.status = 'interrupted'
      interrupted[#interrupted + 1] = s
      interrupted[#interrupted + 1] = format(old)
    end
    r = set_running(r, s, nil)
    running[s] = nil
  end
end
if #interrupted > 0 then
  redis.call('HSET', KEYS[1], unpack(interrupted))
end

local reason = kind
if reason == 'takeover' then
  reason = 'scheduled'
end
run = { status = 'running', attempt = 1, deaths = 0, attempts = '' }
start(run, reason)
r = set_running(r, slot_key, run.lease_end)
running[slot_key] = run.lease_end
local count = tonumber(live[6] or '0') + 1

-- Step 3: keep history_size finished runs, but never one a late claim could still ask about.
-- Trimmed in batches: once more than half as many again are kept, down to history_size.
local history = tonumber(ARGV[12])
local runs = 0
for _ in pairs(running) do
  runs = runs + 1
end
local excess = count - runs - history
if excess > math.floor(history / 2) then
  local oldest = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. int(now - tonumber(ARGV[11])),
    'LIMIT', 0, excess + runs)
  local gone = {}
  for _, s in ipairs(oldest) do
    if #gone >= excess then
      break
    end
    if not running[s] then
      gone[#gone + 1] = s
    end
  end
  if #gone > 0 then
    redis.call('HDEL', KEYS[1], unpack(gone))
    redis.call('ZREM', KEYS[3], unpack(gone))
    count = count - #gone
  end
end

redis.call('HSET', KEYS[1], slot_key, format(run), 'n', slot_key, 'f', run.fence, 'r', r,
  'c', int(count))
redis.call('ZADD', KEYS[3], slot_key, slot_key)
hold(run)
return won(run)
