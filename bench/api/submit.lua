-- submit.lua - wrk script: POST the synthetic job spec over and over.
-- At the end it prints each status other than 201 with its count and the
-- first such answer's body ("non-201: 503 x3 ..."), so that a run's non-2xx
-- count says what it was.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open(os.getenv("SPEC") or "examples/synthetic_binary.json", "r"))
wrk.body = f:read("*a")
f:close()
local threads = {}
function setup(thread)
  table.insert(threads, thread)
end
created = 0
others = {}
first = ""
response = function(status, headers, body)
  if status == 201 then
    created = created + 1
  else
    others[status] = (others[status] or 0) + 1
    if first == "" then first = status .. " " .. string.sub(body or "", 1, 200) end
  end
end
function done(summary, latency, requests)
  local counts, firsts = {}, ""
  for _, t in ipairs(threads) do
    for status, n in pairs(t:get("others") or {}) do counts[status] = (counts[status] or 0) + n end
    if firsts == "" then firsts = t:get("first") or "" end
  end
  local parts = {}
  for status, n in pairs(counts) do table.insert(parts, status .. " x" .. n) end
  if #parts > 0 then
    io.write("non-201: " .. table.concat(parts, ", ") .. "; first: " .. firsts .. "\n")
  end
end
