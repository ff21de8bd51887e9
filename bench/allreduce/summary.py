"""summary.py - the table, ratios and JSON line of bench/allreduce/run.sh.

Reads the JSON lines of comm_bench, torch_gloo.py and mpi_allreduce, split
into rounds by "#round N" lines. Each figure is the median over rounds;
each ratio is the median of the ratios taken within each round (the two
sides measured a few seconds apart, so a noisy moment of a shared machine
weighs on both). Prints the table, then the JSON object as the last line.
"""
import datetime
import json
import statistics
import sys

NAMES = {1048576: "1MiB", 940584: "0.94MB", 16777216: "16MiB", 67108864: "64MiB"}
COLS = ["ours_plain", "ours_buffer", "ours_buffer_rewritten", "ours_tcp", "gloo", "openmpi"]


def load(path):
    fig, rnd = {}, 0  # fig[impl][bytes][round] = GB/s
    for line in open(path):
        if line.startswith("#round"):
            rnd = int(line.split()[1])
            continue
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        k = r["impl"]
        if k == "trainyard":
            k = "ours_tcp" if r["transport"] == "tcp" else "ours_" + r["path"].replace("+rewrite", "_rewritten")
        fig.setdefault(k, {}).setdefault(r["bytes"], {})[rnd] = r["gbps"]
    return fig


def main():
    fig = load(sys.argv[1])

    def vals(b, c):
        return list(fig.get(c, {}).get(b, {}).values())

    def med(b, c):
        v = vals(b, c)
        return round(statistics.median(v), 3) if v else None

    def rng(b, c):
        v = vals(b, c)
        return [min(v), max(v)] if v else None

    def ratio(b, a, z):
        A, Z = fig.get(a, {}).get(b, {}), fig.get(z, {}).get(b, {})
        v = [A[r] / Z[r] for r in A if Z.get(r)]
        return round(statistics.median(v), 2) if v else None

    def f(v):
        return "%.2f" % v if v is not None else "-"

    rounds = len({r for c in fig.values() for b in c.values() for r in b})
    print("\nalgorithm bandwidth, GB/s: buffer bytes / time per all-reduce, 2 processes, median of %d rounds"
          % rounds)
    fmt = "%-7s %10s %11s %11s %8s %6s %8s | %10s %9s | %11s %10s"
    print(fmt % ("size", "ours plain", "ours buffer", "(rewritten)", "ours tcp", "gloo", "openmpi",
                 "plain/gloo", "plain/mpi", "buffer/gloo", "buffer/mpi"))
    summary = {"date": datetime.date.today().isoformat(), "ranks": 2, "rounds": rounds,
               "unit": "GB/s algorithm bandwidth, median over rounds", "ratio_path": "plain", "sizes": {}}
    for b, nm in NAMES.items():
        g = {c: med(b, c) for c in COLS}
        r = {"plain_vs_gloo": ratio(b, "ours_plain", "gloo"), "plain_vs_mpi": ratio(b, "ours_plain", "openmpi"),
             "buffer_vs_gloo": ratio(b, "ours_buffer", "gloo"), "buffer_vs_mpi": ratio(b, "ours_buffer", "openmpi")}
        print(fmt % (nm, f(g["ours_plain"]), f(g["ours_buffer"]), f(g["ours_buffer_rewritten"]), f(g["ours_tcp"]),
                     f(g["gloo"]), f(g["openmpi"]), f(r["plain_vs_gloo"]), f(r["plain_vs_mpi"]),
                     f(r["buffer_vs_gloo"]), f(r["buffer_vs_mpi"])))
        entry = {"bytes": b}
        entry.update({c + "_gbps": g[c] for c in COLS})
        entry.update({c + "_range": rng(b, c) for c in ("ours_plain", "gloo", "openmpi")})
        entry.update(r)
        summary["sizes"][nm] = entry
    print("ranges over rounds, GB/s (min-max):")
    for b, nm in NAMES.items():
        print("  %-7s ours plain %s, gloo %s, openmpi %s" % (
            nm, *("-".join(f(x) for x in (rng(b, c) or [])) for c in ("ours_plain", "gloo", "openmpi"))))
    s = summary["sizes"]
    summary["ratio_vs_gloo_64MiB"] = s["64MiB"]["plain_vs_gloo"]
    summary["ratio_vs_mpi_1MiB"] = s["1MiB"]["plain_vs_mpi"]
    summary["buffer_ratio_vs_gloo_64MiB"] = s["64MiB"]["buffer_vs_gloo"]
    summary["buffer_ratio_vs_mpi_1MiB"] = s["1MiB"]["buffer_vs_mpi"]
    print("targets (plain path): >= openmpi at every size: %s; >= 3x gloo at 16 and 64 MiB: %s" % (
        all((s[n]["plain_vs_mpi"] or 0) >= 1 for n in s),
        all((s[n]["plain_vs_gloo"] or 0) >= 3 for n in ("16MiB", "64MiB"))))
    print(json.dumps(summary, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
