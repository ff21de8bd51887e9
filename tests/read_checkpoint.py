#!/usr/bin/python3
"""read_checkpoint.py FILE EXPECTED.json - read a trainyard checkpoint as any
safetensors reader would (8-byte little-endian header length, JSON header,
raw little-endian F32 data) with the standard library and numpy only, and
check it against what the C side reported.

EXPECTED.json: {"metadata": {key: value, ...},
                "tensors": {name: {"shape": [...], "first": [a, b],
                                   "last": z, "sum": s}, ...}}
Exits 0 when everything matches, 1 (with the reasons) otherwise."""
import json
import struct
import sys

import numpy as np


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("file shorter than the header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"header length {n} past the end of a {len(data)}-byte file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    spans = []
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise ValueError(f"{name}: dtype {info['dtype']}")
        b, e = info["data_offsets"]
        shape = info["shape"]
        count = int(np.prod(shape)) if shape else 1
        if e - b != 4 * count or e > len(body):
            raise ValueError(f"{name}: data_offsets {b},{e} do not fit shape {shape}")
        tensors[name] = np.frombuffer(body[b:e], dtype="<f4").reshape(shape)
        spans.append((b, e))
    spans.sort()
    pos = 0
    for b, e in spans:  # safetensors: contiguous, no holes, no overlap
        if b != pos:
            raise ValueError(f"data not contiguous at byte {pos}")
        pos = e
    if pos != len(body):
        raise ValueError(f"{len(body) - pos} bytes after the last tensor")
    for k, v in meta.items():
        if not isinstance(v, str):
            raise ValueError(f"metadata {k} is not a string")
    return tensors, meta


def main():
    if len(sys.argv) != 3:
        print("usage: read_checkpoint.py FILE EXPECTED.json", file=sys.stderr)
        return 2
    tensors, meta = read(sys.argv[1])
    with open(sys.argv[2]) as f:
        want = json.load(f)
    errors = []
    for k, v in want.get("metadata", {}).items():
        if meta.get(k) != v:
            errors.append(f"metadata {k}: {meta.get(k)!r} != {v!r}")
    if set(tensors) != set(want["tensors"]):
        errors.append(f"tensor names differ: {sorted(set(tensors) ^ set(want['tensors']))}")
    for name, w in want["tensors"].items():
        t = tensors.get(name)
        if t is None:
            continue
        if list(t.shape) != w["shape"]:
            errors.append(f"{name}: shape {list(t.shape)} != {w['shape']}")
            continue
        flat = t.reshape(-1)
        if [float(flat[0]), float(flat[1])] != [float(np.float32(x)) for x in w["first"]]:
            errors.append(f"{name}: first values {flat[:2]} != {w['first']}")
        if float(flat[-1]) != float(np.float32(w["last"])):
            errors.append(f"{name}: last value {flat[-1]} != {w['last']}")
        s = float(flat.astype(np.float64).sum())
        if abs(s - w["sum"]) > 1e-9 * max(1.0, abs(w["sum"])):
            errors.append(f"{name}: sum {s} != {w['sum']}")
    for e in errors:
        print("read_checkpoint.py:", e, file=sys.stderr)
    if not errors:
        print(f"read_checkpoint.py: {len(tensors)} tensors and metadata match")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
