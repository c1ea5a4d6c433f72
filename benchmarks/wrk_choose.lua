-- POST /choose with a fixed body; records every decision id to ids-<thread>.txt
-- so the /reward run can use fresh decisions.
local counter = 0
local threads = {}

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  wrk.method = "POST"
  wrk.body = args[1]
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["X-API-Key"] = args[2]
  out = io.open(args[3] .. "/ids-" .. id .. ".txt", "w")
end

function response(status, headers, body)
  local decision = body:match('"decision_id"%s*:%s*"([0-9a-f]+)"')
  if decision then out:write(decision, "\n") end
end

function done(summary, latency, requests)
  io.stderr:write(string.format("non-2xx or socket errors: %d\n",
    summary.errors.status + summary.errors.connect + summary.errors.read +
    summary.errors.write + summary.errors.timeout))
end
