#!/usr/bin/python3
"""api_load.py URL TOKEN JOB INFLIGHT WS OUT - the load of bench/proxy/api_load.sh.

Holds INFLIGHT requests through the server's proxy at once (each a 3 s event
stream from tests/proxy_upstream.py, re-issued as it ends) and WS WebSockets
(python3-websocket), each echoing a frame every 100 ms. Writes OUT.ready once
all are up and OUT (JSON: in_flight, websockets, echoes, errors) on SIGTERM.
"""
import http.client
import json
import signal
import sys
import threading
import time
import urllib.parse

import websocket

url, token, job, inflight, nws, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
u = urllib.parse.urlparse(url)
stop = threading.Event()
lock = threading.Lock()
stats = {"streams_open": 0, "ws_open": 0, "echoes": 0, "errors": 0}


def bump(k, n=1):
    with lock:
        stats[k] += n


def streamer():
    while not stop.is_set():
        try:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
            c.request("GET", "/proxy/jobs/%s/web/stream" % job, headers={"Authorization": "Bearer " + token})
            r = c.getresponse()
            if r.status != 200:
                bump("errors")
            bump("streams_open")
            while r.read(64):
                if stop.is_set():
                    break
            bump("streams_open", -1)
            c.close()
        except Exception:
            bump("errors")
            time.sleep(0.1)


def echoer(i):
    try:
        ws = websocket.create_connection("ws://%s:%d/proxy/jobs/%s/web/ws" % (u.hostname, u.port, job),
                                         header=["Authorization: Bearer " + token], timeout=30)
    except Exception:
        bump("errors")
        return
    bump("ws_open")
    n = 0
    while not stop.is_set():
        msg = "socket %d frame %d" % (i, n)
        try:
            ws.send(msg)
            if ws.recv() != msg:
                bump("errors")
            bump("echoes")
        except Exception:
            bump("errors")
            break
        n += 1
        stop.wait(0.1)
    ws.close()


def finish(*_):
    stop.set()


signal.signal(signal.SIGTERM, finish)
threads = [threading.Thread(target=streamer, daemon=True) for _ in range(inflight)]
threads += [threading.Thread(target=echoer, args=(i,), daemon=True) for i in range(nws)]
for t in threads:
    t.start()
end = time.time() + 60
while time.time() < end and not stop.is_set():
    with lock:
        if stats["streams_open"] >= inflight and stats["ws_open"] >= nws:
            break
    time.sleep(0.05)
with open(out + ".ready", "w") as f:
    f.write(json.dumps(stats))
peak = dict(stats)
while not stop.is_set():
    stop.wait(0.2)
    with lock:
        peak["streams_open"] = max(peak["streams_open"], stats["streams_open"])
with lock:
    json.dump({"in_flight": peak["streams_open"], "websockets": stats["ws_open"], "echoes": stats["echoes"],
               "errors": stats["errors"]}, open(out, "w"))
