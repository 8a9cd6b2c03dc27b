-- Shared by every script of the Redis/Valkey store (prepended to each). KEYS are the job's keys,
-- all under the hash tag {<namespace>:<job>}: KEYS[1] runs (hash slot -> run record as JSON),
-- KEYS[2] slots (sorted set of every slot with state, by slot), KEYS[3] running (sorted set of
-- the runs whose status is running, by lease end: the live leases are those scored after now),
-- KEYS[4] fence (the job's fence counter), KEYS[5] paused (the pause in force, as JSON; absent
-- while the job is not paused).
--
-- Fences are written as strings of digits, in the counter and in the records: cjson encodes a
-- number with 14 significant digits, and a fence (the clock in µs) has 16.

-- The store's clock: TIME on the server, in ms, and in µs (exact in a Lua number until 2255).
local function clock()
  local t = redis.call('TIME')
  local secs, micros = tonumber(t[1]), tonumber(t[2])
  return secs * 1000 + math.floor(micros / 1000), secs * 1000000 + micros
end

-- The store's clock in ms.
local function now_ms()
  local ms = clock()
  return ms
end

-- A whole number as a decimal string, for keys and scores.
local function int(x)
  return string.format('%d', x)
end

local function is_unset(v)
  return v == nil or v == cjson.null
end

-- Writes a run back and keeps the running set in step with its status.
local function save(key, run)
  redis.call('HSET', KEYS[1], key, cjson.encode(run))
  if run.status == 'running' then
    redis.call('ZADD', KEYS[3], int(run.lease_end), key)
  else
    redis.call('ZREM', KEYS[3], key)
  end
end

local function load(key)
  local raw = redis.call('HGET', KEYS[1], key)
  if not raw then
    return nil
  end
  return cjson.decode(raw)
end

-- Rules 2 and 4: whether a token may act on a run (current token, running, not released).
local function holds(run, token)
  return run.status == 'running' and run.token == token and not run.released
end

-- What a caller whose token was refused is told.
local function state(run)
  return { attempt = run.attempt, status = run.status, released = run.released }
end

-- Ends the current attempt of an expired run as died (a hand-over's end is recorded already).
local function end_expired_attempt(run)
  local current = run.attempts[#run.attempts]
  if current and is_unset(current.outcome) then
    current.outcome = 'died'
    current.ended_at = run.lease_end
  end
end
