-- Shared by every script of the Redis/Valkey store (prepended to each). Every key of a job is
-- under its hash tag {<namespace>:<job>}. KEYS[1] is the job's live hash, which holds
-- everything a claim, a heartbeat and a finish read and write, so that each reads it once and
-- writes it once:
--
--   n          the newest slot with state
--   f          the fence counter, a string of digits (see next_fence in claim.lua)
--   p          the pause in force, as JSON; absent while the job is not paused
--   r          the runs whose status is running: ' <slot>:<lease end>' each
--   c          how many runs have state
--   <slot>     the run record: a head line, then the attempts as a JSON array
--
-- The head line is '<status> <attempt> <lease end> <released 0|1> <fence> <deaths> <token>
-- <runner as a JSON string>'. No script decodes or encodes JSON: the attempts are text, an
-- attempt is appended as text, and an attempt's end is appended to its text.
--
-- KEYS[2] is the lease key of the slot in hand ('<token> <attempt> <lease end> <fence>
-- <runner as JSON>'): it exists exactly while the current attempt's lease is alive by the
-- store's clock (it expires at the lease end), unreleased, and the job is not paused, so a claim
-- that finds it is answered from it alone. It is a copy: the record decides whenever it is
-- absent.
--
-- Fences are strings of digits, in the counter and in the records: a fence (the clock in µs)
-- has 16 digits, and a Lua number is exact only to 2^53.

-- The store's clock: TIME on the server, in ms, and in µs (exact in a Lua number until 2255).
local function clock()
  local t = redis.call('TIME')
  local secs, micros = tonumber(t[1]), tonumber(t[2])
  return secs * 1000 + math.floor(micros / 1000), secs * 1000000 + micros
end

-- A whole number as a decimal string, for keys, fields and scores.
local function int(x)
  return string.format('%d', x)
end

-- The run record in `raw`, as a table.
local function parse(raw)
  local nl = string.find(raw, '\n', 1, true)
  local status, attempt, lease_end, released, fence, deaths, token, runner = string.match(
    string.sub(raw, 1, nl - 1), '^(%S+) (%d+) (%-?%d+) ([01]) (%d+) (%d+) (%S+) (.*)$')
  return {
    status = status, attempt = tonumber(attempt), lease_end = tonumber(lease_end),
    released = released == '1', fence = fence, deaths = tonumber(deaths), token = token,
    runner = runner, attempts = string.sub(raw, nl + 1),
  }
end

-- The run record of `run`, as text.
local function format(run)
  return run.status .. ' ' .. int(run.attempt) .. ' ' .. int(run.lease_end) .. ' '
    .. (run.released and '1' or '0') .. ' ' .. run.fence .. ' ' .. int(run.deaths) .. ' '
    .. run.token .. ' ' .. run.runner .. '\n' .. run.attempts
end

-- Records the end of the current attempt (the last of the array).
local function end_attempt(run, outcome, at)
  run.attempts = string.sub(run.attempts, 1, -3) .. ',"outcome":"' .. outcome
    .. '","ended_at":' .. int(at) .. '}]'
end

-- The lease key's value for the current attempt of `run`.
local function lease_value(run)
  return run.token .. ' ' .. int(run.attempt) .. ' ' .. int(run.lease_end) .. ' ' .. run.fence
    .. ' ' .. run.runner
end

-- Writes the lease key of the slot in hand: it expires as the lease ends (the key lives while
-- the server's clock is at most its expiry; the lease while the clock is before its end).
local function hold(run)
  redis.call('SET', KEYS[2], lease_value(run), 'PXAT', int(run.lease_end - 1))
end

-- The running runs in `r`, as a table from slot (text) to lease end.
local function running_of(r)
  local runs = {}
  if r then
    for slot, lease_end in string.gmatch(r, ' (%-?%d+):(%-?%d+)') do
      runs[slot] = tonumber(lease_end)
    end
  end
  return runs
end

-- `r` with `slot` set to `lease_end`, or taken out when `lease_end` is nil.
local function set_running(r, slot, lease_end)
  local out = {}
  for s, l in string.gmatch(r or '', ' (%-?%d+):(%-?%d+)') do
    if s ~= slot then
      out[#out + 1] = ' ' .. s .. ':' .. l
    end
  end
  if lease_end then
    out[#out + 1] = ' ' .. slot .. ':' .. int(lease_end)
  end
  return table.concat(out)
end

-- Rules 2 and 4: whether a token may act on a run (current token, running, not released).
local function holds(run, token)
  return run.status == 'running' and run.token == token and not run.released
end

-- What a caller whose token was refused is told: '<attempt> <status> <released 0|1>'.
local function state(run)
  return int(run.attempt) .. ' ' .. run.status .. ' ' .. (run.released and '1' or '0')
end

-- Ends the current attempt of an expired run as died (a hand-over's end is recorded already).
local function end_expired_attempt(run)
  if not run.released then
    end_attempt(run, 'died', run.lease_end)
    run.deaths = run.deaths + 1
  end
end
