#!/usr/bin/env python3
"""readme_check.py [BUILD] - run the README's shell blocks as a user would.

Every ```sh block of README.md is run, command by command and in order, in
one bash session (so U, A, ID ... carry from one block to the next) against a
real service: `scripts/run.sh` (what `make run` starts after building) in a
scratch directory laid out like a checkout:

    SCRATCH/build/trainyard -> BUILD/trainyard (the build under test)
    SCRATCH/examples/          a copy of examples/
    SCRATCH/scripts/           a copy of scripts/ (run.sh; s3-dev.sh and pg-dev.sh, with
                               pg-scram-pass.py: the S3 store and the PostgreSQL to try)
    SCRATCH/.trainyard/        the service's data (token, admin.token, ...)

The service listens on 127.0.0.1:8080, as the README says. When that port
is taken (another service on this machine), it listens on a free port
instead and the check rewrites "127.0.0.1:8080" in the commands to that
port (and sets TRAINYARD_URL for the CLI, whose default is :8080); it says
so in its output.

A command fails the check when
  - it exits other than 0, or other than N where its trailing comment says
    "exit N" (e.g. `trainyard cancel 1   # exit 1: job 1 has finished`);
  - the lines right under it that start with "# => " (what it prints) are
    not what it printed (stdout, then stderr);
  - it prints an API error ({"error": ...}) that the README does not show;
  - it ends in a jq filter and the filter found nothing, or gave null where
    the README names a value (a null result, a null top-level field of an
    object it builds, or "null" in the text of `jq -r`);
  - it sets a variable (ID=$(...)) to nothing or to "null";
  - it runs longer than its time (60 s; `-f`, `watch` and `train`: 150 s).

Not run, and listed as skipped with the reason:
  - the commands of SKIP_COMMANDS below (`make run`, `make test`: the check
    itself plays `make run`; CI runs `make test`);
  - a block right after the line
        <!-- readme-check: skip REASON -->
    in README.md (a block for other machines or hardware: a GPU, a second
    node), invisible on the rendered page.

`readme_check.py --list` prints what a run would run and skip, and the
output and exit status it would expect, without running anything.
Environment: TRAINYARD_BIN (the binary; default BUILD/trainyard),
README_CHECK_KEEP=1 keeps the scratch directory, README_CHECK_FILE another
file to check instead of README.md.
"""
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
NAME = "README.md"  # the checked file's name in what the check prints
PORT = 8080

# Commands the check never runs, with why.
SKIP_COMMANDS = {
    "make run": "the check starts the service itself (scripts/run.sh, which `make run` runs after building)",
    "make test": "the test suite this check is part of (CI runs it)",
}
SKIP_MARK = re.compile(r"^<!--\s*readme-check:\s*skip\s+(.*?)\s*-->\s*$")
DEFAULT_TIMEOUT = 60
LONG_TIMEOUT = 150


def log(msg):
    print(msg, flush=True)


# ------------------------------------------------------------------ parsing

def split_comment(line):
    """(code, trailing comment) of one shell line: '#' after a blank, outside quotes."""
    q = None
    i = 0
    while i < len(line):
        c = line[i]
        if q:
            if c == "\\" and q == '"':
                i += 1
            elif c == q:
                q = None
        elif c in "'\"":
            q = c
        elif c == "\\":
            i += 1
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip(), line[i + 1:].strip()
        i += 1
    return line.rstrip(), ""


def parse_readme(path):
    """The README's sh blocks: [{line, skip, commands: [{line, text, comment, expect}]}]."""
    blocks = []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    prev = ""
    while i < len(lines):
        ln = lines[i]
        if re.match(r"^```(sh|bash|shell)\s*$", ln):
            m = SKIP_MARK.match(prev)
            blk = {"line": i + 1, "skip": m.group(1) if m else None, "commands": []}
            i += 1
            cur = None
            while i < len(lines) and not lines[i].startswith("```"):
                raw = lines[i]
                s = raw.strip()
                if s.startswith("# =>") and cur is not None:
                    cur["expect"].append(s[4:].strip())
                elif not s or s.startswith("#"):
                    cur = None
                else:
                    start = i
                    text = raw
                    while text.endswith("\\") and i + 1 < len(lines):
                        i += 1
                        text = text[:-1] + "\n" + lines[i]
                    code, comment = split_comment(text)
                    cur = {"line": start + 1, "text": code, "comment": comment, "expect": []}
                    blk["commands"].append(cur)
                i += 1
            blocks.append(blk)
        if ln.strip():
            prev = ln.strip()
        i += 1
    return blocks


# ------------------------------------------------------------------ the service

def port_free(port):
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def start_service(scratch, listen, env):
    """scripts/run.sh in scratch; (process, url) or (None, None) if it did not start."""
    data = os.path.join(scratch, ".trainyard")
    logf = open(os.path.join(scratch, "service.log"), "ab")
    p = subprocess.Popen(["scripts/run.sh", "--listen", listen], cwd=scratch, env=env, stdout=logf,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    urlfile = os.path.join(data, "server.url")
    # run.sh submits the demo once the server answers; its message follows
    for _ in range(600):
        if p.poll() is not None:
            return None, None
        if os.path.exists(urlfile) and os.path.getsize(urlfile) > 0:
            url = open(urlfile).read().strip()
            deadline = time.time() + 30
            while time.time() < deadline and p.poll() is None:
                if b"demo: job" in open(os.path.join(scratch, "service.log"), "rb").read():
                    return p, url
                time.sleep(0.1)
            return (p, url) if p.poll() is None else (None, None)
        time.sleep(0.1)
    stop(p)
    return None, None


def stop(p, grace=30):
    if p is None or p.poll() is not None:
        return
    try:
        os.kill(p.pid, signal.SIGTERM)
        p.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------ checks

def pipeline(cmd):
    """The stages of a shell pipeline: split at '|' outside quotes (not '||')."""
    stages, cur, q, i = [], "", None, 0
    while i < len(cmd):
        c = cmd[i]
        if q:
            if c == "\\" and q == '"' and i + 1 < len(cmd):
                cur += c
                i += 1
                c = cmd[i]
            elif c == q:
                q = None
        elif c in "'\"":
            q = c
        elif c == "|" and cmd[i + 1:i + 2] != "|" and cmd[i - 1:i] != "|":
            stages.append(cur)
            cur = ""
            i += 1
            continue
        cur += c
        i += 1
    stages.append(cur)
    return stages


def jq_filter(cmd):
    """The jq stage ending the command's pipeline: (its options, True) or (None, False)."""
    last = pipeline(cmd)[-1].strip()
    if not re.match(r"^jq(\s|$)", last):
        return None, False
    return last.split()[1:], True


def json_stream(text):
    dec = json.JSONDecoder()
    out, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        v, i = dec.raw_decode(text, i)
        out.append(v)


def check_output(c, rc, out, err, var):
    """The list of what is wrong with one command's run."""
    bad = []
    m = re.search(r"\bexit (\d+)\b", c["comment"])
    want_rc = int(m.group(1)) if m else 0
    if rc != want_rc:
        bad.append(f"exit status {rc}, want {want_rc}")
    if c["expect"]:
        got = [ln.rstrip() for ln in (out + err).strip("\n").split("\n")]
        if got != c["expect"]:
            bad.append("its output is not the README's '# =>' lines; it printed:\n      " + "\n      ".join(got) +
                       "\n    the README shows:\n      " + "\n      ".join(c["expect"]))
        return bad
    for ln in out.split("\n"):
        if ln.lstrip().startswith('{"error"') or ln.strip() == '"error": {':
            bad.append(f"an API error the README does not show: {ln.strip()[:200]}")
            break
    opts, is_jq = jq_filter(c["text"])
    if is_jq and var is None:
        if not out.strip():
            bad.append("the jq filter found nothing")
        elif "-r" in opts:
            if re.search(r"(^|\s)null(\s|$)", out):
                bad.append("null in what jq printed (a field the filter names is missing)")
        else:
            try:
                vals = json_stream(out)
            except ValueError as e:
                bad.append(f"jq printed no JSON ({e})")
                vals = []
            for v in vals:
                if v is None:
                    bad.append("jq printed null (the field the filter names is missing)")
                    break
                if isinstance(v, dict):
                    nulls = [k for k, x in v.items() if x is None]
                    if nulls:
                        bad.append(f"null where the filter names a value: {', '.join(nulls)}")
                        break
    if var is not None and var[1].strip() in ("", "null"):
        bad.append(f"{var[0]} is {var[1].strip() or 'empty'}")
    return bad


# ------------------------------------------------------------------ the shell session

class Session:
    """One bash reading commands from a pipe; each command's output goes to files."""

    def __init__(self, scratch, env):
        self.dir = os.path.join(scratch, ".readme-check")
        os.makedirs(self.dir)
        self.errlog = open(os.path.join(self.dir, "bash.stderr"), "wb")
        self.p = subprocess.Popen(["bash", "--noprofile", "--norc"], cwd=scratch, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errlog,
                                  start_new_session=True)
        self.n = 0
        self.send("set -o pipefail\n")

    def send(self, s):
        self.p.stdin.write(s.encode())
        self.p.stdin.flush()

    def run(self, text, varname, timeout):
        """(rc, stdout, stderr, (var, value) or None, seconds); rc None on timeout."""
        self.n += 1
        f = os.path.join(self.dir, str(self.n))
        with open(f + ".cmd", "w") as fh:
            fh.write(text + "\n")
        script = (f'eval "$(cat {f}.cmd)" >{f}.out 2>{f}.err </dev/null; echo $? >{f}.rc\n')
        if varname:
            script += f'printf "%s" "${varname}" >{f}.var\n'
        script += f"echo __done_{self.n}\n"
        t0 = time.time()
        self.send(script)
        want = f"__done_{self.n}".encode()
        buf = b""
        while want not in buf:
            left = t0 + timeout - time.time()
            if left <= 0:
                return None, self.read(f + ".out"), self.read(f + ".err"), None, time.time() - t0
            r, _, _ = select.select([self.p.stdout], [], [], left)
            if r:
                chunk = os.read(self.p.stdout.fileno(), 4096)
                if not chunk:
                    return None, self.read(f + ".out"), "bash exited", None, time.time() - t0
                buf += chunk
        rc = int(self.read(f + ".rc").strip() or "-1")
        var = (varname, self.read(f + ".var")) if varname else None
        return rc, self.read(f + ".out"), self.read(f + ".err"), var, time.time() - t0

    @staticmethod
    def read(path):
        try:
            return open(path, encoding="utf-8", errors="replace").read()
        except FileNotFoundError:
            return ""

    def close(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()


def list_blocks(blocks):
    """--list: what a run would run and skip, without running anything."""
    for b in blocks:
        if b["skip"]:
            log(f"SKIP block at {NAME}:{b['line']}: {b['skip']}")
            continue
        log(f"block at {NAME}:{b['line']}")
        for c in b["commands"]:
            t = c["text"].strip()
            m = re.search(r"\bexit (\d+)\b", c["comment"])
            log(f"  {'SKIP' if t in SKIP_COMMANDS else 'run '} {NAME}:{c['line']}: {t}" +
                (f"   [exit {m.group(1)}]" if m else "") + "".join(f"\n       => {e}" for e in c["expect"]))
    return 0


def main():
    args = sys.argv[1:]
    global NAME
    readme = os.environ.get("README_CHECK_FILE", README)
    NAME = os.path.basename(readme)
    if args and args[0] == "--list":
        return list_blocks(parse_readme(readme))
    build = args[0] if args else "build/asan"
    binary = os.environ.get("TRAINYARD_BIN") or os.path.join(ROOT, build, "trainyard")
    binary = os.path.abspath(binary)
    if not os.access(binary, os.X_OK):
        log(f"readme_check: no binary at {binary}")
        return 1
    blocks = parse_readme(readme)
    scratch = tempfile.mkdtemp(prefix="ty_readme.")
    # as root, the agent runs tasks under uids of their own that read this directory
    os.chmod(scratch, 0o755)
    os.makedirs(os.path.join(scratch, "build"))
    os.symlink(binary, os.path.join(scratch, "build", "trainyard"))
    shutil.copytree(os.path.join(ROOT, "examples"), os.path.join(scratch, "examples"))
    # every script, with the helpers they call (pg-dev.sh: pg-scram-pass.py)
    shutil.copytree(os.path.join(ROOT, "scripts"), os.path.join(scratch, "scripts"))
    env = dict(os.environ)
    for k in ("TRAINYARD_URL", "TRAINYARD_TOKEN", "TRAINYARD_TOKEN_FILE"):
        env.pop(k, None)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    log(f"readme_check: README.md's sh blocks against {binary}, in {scratch}")

    svc, url, sess = None, None, None
    rewrite = None
    failures = []
    ran = skipped = 0
    t_start = time.time()
    try:
        if port_free(PORT):
            svc, url = start_service(scratch, f"127.0.0.1:{PORT}", env)
        if svc is None:
            svc, url = start_service(scratch, "127.0.0.1:0", env)
            if svc is None:
                log("readme_check: FAILED: the service did not start:")
                log(Session.read(os.path.join(scratch, "service.log"))[-3000:])
                return 1
            hostport = url.split("//", 1)[1]
            rewrite = hostport
            env["TRAINYARD_URL"] = url
            log(f"readme_check: 127.0.0.1:{PORT} is taken on this machine: the service listens on {hostport};"
                f" the commands' 127.0.0.1:{PORT} is rewritten to it and TRAINYARD_URL={url} is set for the CLI")
        log(f"readme_check: service up at {url} (scripts/run.sh: trainyard up, the demo job submitted)")
        sess = Session(scratch, env)
        for b in blocks:
            if b["skip"]:
                skipped += len(b["commands"])
                log(f"\nSKIP block at {NAME}:{b['line']} ({len(b['commands'])} command(s)): {b['skip']}")
                continue
            log(f"\nblock at {NAME}:{b['line']}")
            for c in b["commands"]:
                text = c["text"]
                if text.strip() in SKIP_COMMANDS:
                    skipped += 1
                    log(f"  SKIP {text.strip()}: {SKIP_COMMANDS[text.strip()]}")
                    continue
                if rewrite:
                    text = text.replace(f"127.0.0.1:{PORT}", rewrite)
                m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=", text)
                varname = m.group(1) if m else None
                long_ = re.search(r"(\s-f(\s|$))|(\bwatch\b)|(\btrain\b)", text) is not None
                rc, out, err, var, secs = sess.run(text, varname, LONG_TIMEOUT if long_ else DEFAULT_TIMEOUT)
                ran += 1
                if rc is None:
                    bad = [f"still running after {LONG_TIMEOUT if long_ else DEFAULT_TIMEOUT} s"]
                else:
                    bad = check_output(c, rc, out, err, var)
                status = "ok  " if not bad else "FAIL"
                log(f"  {status} {NAME}:{c['line']}: {text}   ({secs:.1f} s)")
                if bad:
                    failures.append((c["line"], text, bad))
                    for x in bad:
                        log(f"    {x}")
                    tail = (out + err).strip().split("\n")[-8:]
                    log("    its output (last lines):\n      " + "\n      ".join(tail))
                if rc is None:
                    # the session is stuck in that command; what follows depends on it
                    log("readme_check: stopping here (a command did not end)")
                    break
            else:
                continue
            break
    finally:
        if sess:
            sess.close()
        stop(svc)
    secs = time.time() - t_start
    log(f"\nreadme_check: {ran} command(s) run, {skipped} skipped, {len(failures)} failed, {secs:.0f} s")
    if failures:
        log("readme_check: FAILED (a README command does not work as written):")
        for line, text, bad in failures:
            log(f"  {NAME}:{line}: {text}: {bad[0].splitlines()[0]}")
        log(f"  the service's log: {scratch}/service.log (kept)")
        return 1
    if os.environ.get("README_CHECK_KEEP") == "1":
        log(f"readme_check: kept {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
