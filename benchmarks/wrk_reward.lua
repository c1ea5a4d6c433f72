-- POST /reward, each request with the next unused decision id from the /choose run.
local ids = {}
local counter = 0

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
end

function init(args)
  experiment, key, dir, nthreads = args[1], args[2], args[3], tonumber(args[4])
  -- Thread i takes every nthreads-th id, so no two threads reward the same decision.
  local n = 0
  for f = 0, nthreads - 1 do
    local fh = io.open(dir .. "/ids-" .. f .. ".txt", "r")
    if fh then
      for line in fh:lines() do
        if n % nthreads == id then ids[#ids + 1] = line end
        n = n + 1
      end
      fh:close()
    end
  end
  next_id = 1
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["X-API-Key"] = key
end

function request()
  local decision = ids[next_id] or "exhausted"
  next_id = next_id + 1
  local body = string.format(
    '{"experiment_id": "%s", "decision_id": "%s", "reward": 0.5}', experiment, decision)
  return wrk.format(nil, "/reward", nil, body)
end
