-- submit.lua - wrk script for slurmrestd: POST the held-job JSON (JOB_JSON) to
-- /slurm/<ver>/job/submit over and over; counts answers that carry a job_id and
-- no error but 2042, "held" ("acked"), and prints "acked=N failed=M" at the end.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open(os.getenv("JOB_JSON"), "r"))
wrk.body = f:read("*a")
f:close()

local threads = {}
function setup(thread) table.insert(threads, thread) end

acked = 0
failed = 0
function response(status, headers, body)
  local ok = status == 200 and body:find('"job_id"%s*:%s*%d') ~= nil
  -- a held job is answered with error_code 2042 ("Job is in held state"); any other is a failure
  for code in body:gmatch('"error_code"%s*:%s*(%d+)') do
    if code ~= "2042" then ok = false end
  end
  if ok then
    acked = acked + 1
  else
    failed = failed + 1
  end
end

function done(summary, latency, requests)
  local a, b = 0, 0
  for _, t in ipairs(threads) do a = a + t:get("acked"); b = b + t:get("failed") end
  io.write(string.format("acked=%d failed=%d\n", a, b))
end
