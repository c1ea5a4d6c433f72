-- A mixed load: every decision is rewarded. request() sends /reward for the
-- oldest decision not yet rewarded, else /choose; response() collects the
-- decision ids /choose returns. About one reward per decision, the case in
-- which every worker's view of the statistics goes stale most often.
local pending = {}
local first, last = 1, 0

function init(args)
  experiment, key = args[1], args[2]
  -- args[3]: the /choose body, when the experiment needs a context
  choose_body = args[3] or string.format('{"experiment_id": "%s"}', experiment)
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
