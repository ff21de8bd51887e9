-- submit.lua - wrk script: POST the synthetic job spec over and over.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open(os.getenv("SPEC") or "examples/synthetic_binary.json", "r"))
wrk.body = f:read("*a")
f:close()
created = 0
response = function(status, headers, body)
  if status == 201 then created = created + 1 end
end
