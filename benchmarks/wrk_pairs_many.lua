-- wrk_pairs.lua over many experiments: wrk thread i drives experiment i, every
-- decision rewarded. Arguments: experiment id, API key, experiment id, API key, ...
-- (one pair per thread: run wrk with -t as many as there are pairs).
local threads = 0

function setup(thread)
  thread:set("index", threads)
  threads = threads + 1
end

local pending = {}
local first, last = 1, 0

function init(args)
  experiment, key = args[2 * index + 1], args[2 * index + 2]
  choose_body = string.format('{"experiment_id": "%s"}', experiment)
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["X-API-Key"] = key
end

function request()
  if first <= last then
    local decision = pending[first]
    pending[first] = nil
    first = first + 1
    local body = string.format(
      '{"experiment_id": "%s", "decision_id": "%s", "reward": 0.5}', experiment, decision)
    return wrk.format("POST", "/reward", nil, body)
  end
  return wrk.format("POST", "/choose", nil, choose_body)
end

function response(status, headers, body)
  local decision = body:find('"arm_id"', 1, true) and
    body:match('"decision_id"%s*:%s*"([0-9a-f]+)"')
  if decision then
    last = last + 1
    pending[last] = decision
  end
end
