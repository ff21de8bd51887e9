#!/usr/bin/python3
"""wrk_parse.py FILE - wrk --latency output as one line "rps p50_ms p99_ms errors"
(errors: non-2xx/3xx answers and socket errors). Used by bench/proxy/*.sh."""
import re
import sys

t = open(sys.argv[1]).read()


def ms(v, u):
    return float(v) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[u]


rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
lat = dict((p, ms(v, u)) for p, v, u in re.findall(r"\s(50|99)%\s+([\d.]+)(us|ms|s)", t))
err = sum(int(x) for x in re.findall(r"Non-2xx or 3xx responses: (\d+)", t))
s = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", t)
if s:
    err += sum(int(x) for x in s.groups())
print(rps, lat.get("50"), lat.get("99"), err)
