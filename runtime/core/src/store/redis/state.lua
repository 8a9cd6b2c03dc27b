-- A fenced write to the job's state. KEYS: 1 the live hash (as in every script), 2 state (a
-- hash from key to value), 3 writers (a hash from key to the JSON record of the attempt that
-- wrote it). ARGV: 1 slot, 2 token, 3 operation (set, delete, increment, compare-and-swap), 4 key,
-- 5 the value (set), the amount (increment) or the new value (compare-and-swap), 6 for
-- compare-and-swap '1' when a value is expected and '0' when the key must be absent, 7 the
-- expected value, 8 the most keys the job may hold. Returns the outcome as JSON.
--
-- Only the current token of a running run whose lease is not released and still alive by the
-- store's clock may write; the check and the write are this one script.
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return cjson.encode({ o = 'fenced' })
end
local run = parse(raw)
local now = clock()
if not holds(run, ARGV[2]) or run.lease_end <= now then
  return cjson.encode({ o = 'fenced', state = {
    attempt = run.attempt, status = run.status, released = run.released } })
end

local op, key = ARGV[3], ARGV[4]
local max_keys = tonumber(ARGV[8])

-- Whether a write that adds `key` leaves the job within its key count.
local function room()
  if redis.call('HEXISTS', KEYS[2], key) == 1 then
    return true
  end
  return redis.call('HLEN', KEYS[2]) < max_keys
end

local function record(size)
  redis.call('HSET', KEYS[3], key, cjson.encode({
    slot = tonumber(ARGV[1]), attempt = run.attempt, fence = tostring(run.fence),
    written_at = now, size = size }))
end

local too_many = cjson.encode({ o = 'too-many-keys' })

if op == 'set' then
  if not room() then
    return too_many
  end
  redis.call('HSET', KEYS[2], key, ARGV[5])
  record(#ARGV[5])
  return cjson.encode({ o = 'set' })
elseif op == 'delete' then
  local existed = redis.call('HDEL', KEYS[2], key) == 1
  redis.call('HDEL', KEYS[3], key)
  return cjson.encode({ o = 'deleted', existed = existed })
elseif op == 'increment' then
  if not room() then
    return too_many
  end
  -- HINCRBY keeps 64-bit integers exactly and refuses what is not one, or would overflow.
  local answer = redis.pcall('HINCRBY', KEYS[2], key, ARGV[5])
  if type(answer) == 'table' and answer.err then
    if string.find(answer.err, 'overflow') then
      return cjson.encode({ o = 'overflow' })
    end
    return cjson.encode({ o = 'not-an-integer' })
  end
  -- Read back as text: a Lua number would round a sum beyond 2^53.
  local sum = redis.call('HGET', KEYS[2], key)
  record(#sum)
  return cjson.encode({ o = 'incremented', sum = sum })
elseif op == 'compare-and-swap' then
  local current = redis.call('HGET', KEYS[2], key)
  local matches
  if ARGV[6] == '1' then
    matches = current == ARGV[7]
  else
    matches = current == false
  end
  if not matches then
    return cjson.encode({ o = 'swapped', swapped = false })
  end
  if not room() then
    return too_many
  end
  redis.call('HSET', KEYS[2], key, ARGV[5])
  record(#ARGV[5])
  return cjson.encode({ o = 'swapped', swapped = true })
end
return redis.error_reply('unknown state operation ' .. op)
