#!/usr/bin/env python3
# pg-scram-pass.py PASSFILE ENTRY... - a fresh random password for the role
# trainyard, written only to PASSFILE (0600, libpq's passfile format: one
# line per ENTRY, ENTRY being host:port:database:user); prints the
# password's SCRAM-SHA-256 verifier, what CREATE ROLE ... PASSWORD '...'
# takes, so psql and the server's log never see the password itself.
# Used by scripts/pg-dev.sh and scripts/pg-ha-demo.sh.
import base64
import hashlib
import hmac
import os
import secrets
import sys

if len(sys.argv) < 3:
    sys.exit("usage: pg-scram-pass.py PASSFILE host:port:database:user...")
path, entries = sys.argv[1], sys.argv[2:]
pw = secrets.token_hex(24)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as f:
    for e in entries:
        f.write(f"{e}:{pw}\n")
os.chmod(path, 0o600)
salt, it = secrets.token_bytes(16), 4096
salted = hashlib.pbkdf2_hmac("sha256", pw.encode(), salt, it)
client = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
server = hmac.new(salted, b"Server Key", hashlib.sha256).digest()


def b64(b):
    return base64.b64encode(b).decode()


print(f"SCRAM-SHA-256${it}:{b64(salt)}${b64(hashlib.sha256(client).digest())}:{b64(server)}")
