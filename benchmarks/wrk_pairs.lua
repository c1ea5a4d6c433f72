-- A mixed load: every decision is rewarded. request() sends /reward for the
-- oldest decision not yet rewarded, else /choose; response() collects the
-- decision ids /choose returns. About one reward per decision, the case in
-- which every worker's view of the statistics goes stale most often.
--
-- Arguments: experiment id, API key and the /choose body ('' or absent: just
-- the experiment id; give one when the experiment needs a context), again for
-- each further wrk thread: thread i drives the ith experiment (run wrk with -t
-- as many as there are triples).
local threads = 0

function setup(thread)
  thread:set("index", threads)
  threads = threads + 1
end

local pending = {}
local first, last = 1, 0

function init(args)
  local at = 3 * (index or 0)
  experiment, key = args[at + 1], args[at + 2]
  choose_body = args[at + 3]
  if choose_body == nil or choose_body == '' then
    choose_body = string.format('{"experiment_id": "%s"}', experiment)
  end
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
  -- A reward's reply echoes its decision id too: only a decision has an arm.
  local decision = body:find('"arm_id"', 1, true) and
    body:match('"decision_id"%s*:%s*"([0-9a-f]+)"')
  if decision then
    last = last + 1
    pending[last] = decision
  end
end
