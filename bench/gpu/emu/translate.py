#!/usr/bin/env python3
"""translate.py SRC.cu OUT.cpp - rewrites each kernel launch
`name<<<cfg>>>(args);` of an executor/cuda source into
`emu_launch("name", emu_cfg(cfg), [=]() { name(args); });` for the host
emulation (bench/gpu/emu). Only the launches change; the line count stays
(the compiler's line numbers, and the engine's "file:line" errors, point
into the original)."""
import re
import sys

src, out = sys.argv[1], sys.argv[2]
text = open(src).read()
pat = re.compile(r"(\b\w+)<<<(.*?)>>>\((.*?)\);", re.S)
n = 0


def sub(m):
    global n
    n += 1
    return 'emu_launch("%s", emu_cfg(%s), [=]() { %s(%s); });' % (m.group(1), m.group(2),
                                                                   m.group(1), m.group(3))


text = pat.sub(sub, text)
if "<<<" in text:
    sys.exit("translate.py: a launch left in %s" % src)
with open(out, "w") as f:
    f.write('#line 1 "%s"\n' % src)
    f.write(text)
print("translate.py: %s: %d launches" % (src, n))
