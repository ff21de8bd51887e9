-- submit_paced.lua - wrk script: POST a job spec from each connection every
-- DELAY_MS milliseconds (the submit stream beside the GET load), and write the
-- id of every acknowledged (201) job to ACK_DIR/acked.<thread> so run.sh can
-- check that each one is stored.
local n = 0
function setup(thread)
  n = n + 1
  thread:set("tid", n)
end
function init(args)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  local f = assert(io.open(os.getenv("SPEC") or "examples/synthetic_binary.json", "r"))
  wrk.body = f:read("*a")
  f:close()
  out = assert(io.open((os.getenv("ACK_DIR") or "/tmp") .. "/acked." .. tostring(tid), "w"))
  out:setvbuf("line")
  pause = tonumber(os.getenv("DELAY_MS") or "0")
end
function delay()
  return pause
end
function response(status, headers, body)
  if status == 201 then
    local id = body:match('"id":(%d+)')
    if id then out:write(id, "\n") end
  end
end
