"""Summarises ab.sh results in an output folder: per cell and direction, our TFLOP/s and the peer's time over ours
(same process) for each build and round. Usage: ab-summary.py OUT"""
import json, sys, glob, os, collections
out = sys.argv[1]
rows = collections.defaultdict(dict)
for f in sorted(glob.glob(os.path.join(out, "*-r*-*", "*.json"))):
    tag = os.path.basename(os.path.dirname(f))
    build, rnd, group = tag.split("-", 2)
    d = json.load(open(f))
    if "cells" not in d:
        continue
    for c in d["cells"]:
        for direction in ("fwd", "bwd"):
            ours = c["results"].get("cuteattn", {}).get(direction)
            if not ours or "tflops" not in ours:
                continue
            peers = [(k, v[direction]) for k, v in c["results"].items() if k != "cuteattn" and direction in v and "ms" in v[direction]]
            ratio = " ".join(f"{k}:{pv['ms'] / ours['ms']:.3f}" for k, pv in peers)
            rows[(c["key"], direction)][f"{build}.{rnd}"] = f"{ours['tflops']:.1f} {ratio}"
builds = sorted({k for v in rows.values() for k in v})
print("cell | dir | " + " | ".join(builds))
for (key, direction), v in rows.items():
    print(f"{key} | {direction} | " + " | ".join(v.get(b, "-") for b in builds))
