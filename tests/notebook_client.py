#!/usr/bin/python3
"""notebook_client.py - a notebook job's Jupyter used as a browser would, through
trainyard's proxy (tests/check_interactive.c runs it with Debian's python3 and
python3-websocket).

    notebook_client.py SERVER_URL TOKEN JOB_ID [CODE]

With the caller's own trainyard token only (the proxy adds Jupyter's): lists
/api/contents, starts a kernel, opens its channels WebSocket through the proxy,
executes CODE (default print(6*7)), prints what the kernel printed on a line
"stdout: ..." and the reply's status on "status: ...", deletes the kernel.
Exits 0 when all of it worked, 1 (with why on stderr) otherwise.
"""
import json
import sys
import time
import urllib.request
import uuid

import websocket


def call(method, url, token, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", "Bearer " + token)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read()
        return r.status, json.loads(text) if text else None


def main():
    if len(sys.argv) < 4:
        sys.stderr.write(__doc__)
        return 2
    server, token, job = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
    code = sys.argv[4] if len(sys.argv) > 4 else "print(6*7)"
    base = "%s/proxy/jobs/%s/notebook" % (server, job)

    st, contents = call("GET", base + "/api/contents", token)
    if st != 200 or contents.get("type") != "directory":
        sys.stderr.write("GET /api/contents: %s %r\n" % (st, contents))
        return 1
    print("contents: %d entries" % len(contents.get("content") or []))

    st, kernel = call("POST", base + "/api/kernels", token, {"name": "python3"})
    if st != 201 or "id" not in kernel:
        sys.stderr.write("POST /api/kernels: %s %r\n" % (st, kernel))
        return 1
    kid = kernel["id"]
    print("kernel: " + kid)

    ws_url = base.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
    ws_url += "/api/kernels/%s/channels?session_id=%s" % (kid, uuid.uuid4().hex)
    ws = websocket.create_connection(ws_url, header=["Authorization: Bearer " + token], timeout=60)
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({
        "header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex,
                   "msg_type": "execute_request", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
    }))
    out, status, idle = "", None, False
    deadline = time.time() + 60
    # the reply comes on the shell channel, the output on iopub: neither
    # waits for the other, so the output is whole once iopub says "idle"
    while time.time() < deadline and (status is None or not idle):
        m = json.loads(ws.recv())
        if m.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        t = m.get("msg_type") or m.get("header", {}).get("msg_type")
        if t == "status" and m["content"].get("execution_state") == "idle":
            idle = True
        elif t == "stream":
            out += m["content"].get("text", "")
        elif t == "error":
            sys.stderr.write("the kernel: %s\n" % m["content"].get("evalue"))
        elif t == "execute_reply":
            status = m["content"].get("status")
    ws.close()
    print("stdout: " + out.strip())
    print("status: %s" % status)
    req = urllib.request.Request(base + "/api/kernels/" + kid, method="DELETE")
    req.add_header("Authorization", "Bearer " + token)
    with urllib.request.urlopen(req, timeout=30) as r:
        if r.status != 204:
            sys.stderr.write("DELETE kernel: %s\n" % r.status)
            return 1
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
