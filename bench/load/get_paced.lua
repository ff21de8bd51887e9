-- get_paced.lua - wrk script: each connection waits GET_DELAY_MS between
-- its GETs, so wrk -c32 offers a steady load (about 32 / (delay + latency)
-- requests a second) instead of as many as the machine can answer; the
-- latency wrk reports is still each request's, send to last byte.
function init(args)
  pause = tonumber(os.getenv("GET_DELAY_MS") or "1")
end
function delay()
  return pause
end
