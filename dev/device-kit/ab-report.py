"""Merges unpacked ab.sh result folders (<build>-r<round>-<group>/) into one JSON file and prints markdown tables
of each build against the baseline build A (per cell: TFLOP/s per round, the peer's time over ours, B/A).
Usage: ab-report.py FOLDER OUT_JSON "A=description" "B=description" ..."""
import collections
import glob
import json
import os
import sys

folder, out_json, described = sys.argv[1], sys.argv[2], dict(a.split("=", 1) for a in sys.argv[3:])
runs = []
for f in sorted(glob.glob(os.path.join(folder, "*-r*-*", "*.json"))):
    if f.endswith("partial.json"):
        continue
    build, rnd, group = os.path.basename(os.path.dirname(f)).split("-", 2)
    d = json.load(open(f))
    runs.append({"build": build, "round": int(rnd[1:]), "group": group, "date": d["date"], "device": d["device"],
                 "driver": d["driver"], "torch": d["torch"], "cudnn": d["cudnn"], "cells": d["cells"]})
json.dump({"builds": described, "runs": runs}, open(out_json, "w"), indent=1)

rows, order = collections.defaultdict(lambda: collections.defaultdict(list)), []
for r in runs:
    for c in r["cells"]:
        for direction in ("fwd", "bwd"):
            ours = c["results"].get("cuteattn", {}).get(direction)
            if not ours or "ms" not in ours:
                continue
            peers = [(k, v[direction]["ms"]) for k, v in c["results"].items()
                     if k != "cuteattn" and direction in v and "ms" in v[direction]]
            key = (r["group"], c["key"], direction)
            if key not in order:
                order.append(key)
            ratio = peers[0][1] / ours["ms"] if peers else None
            rows[key][r["build"]].append((r["round"], ours["tflops"], ratio, peers[0][0] if peers else "-"))


def fmt(xs):
    xs = sorted(xs)
    s = "/".join(f"{x[1]:.0f}" for x in xs)
    return s + (" (" + "/".join(f"{x[2]:.3f}" for x in xs) + ")" if xs[0][2] is not None else "")


for b in [b for b in described if b != "A"]:
    print(f"\n### A vs {b}\n\n| group | cell | dir | peer | A TFLOP/s r1/r2 (speed vs peer) | {b} TFLOP/s r1/r2 (speed vs peer)"
          f" | {b}/A |\n|---|---|---|---|---|---|---|")
    for key in order:
        v = rows[key]
        if b in v and "A" in v:
            mean = lambda xs: sum(x[1] for x in xs) / len(xs)  # noqa: E731
            print(f"| {key[0]} | {key[1]} | {key[2]} | {v[b][0][3]} | {fmt(v['A'])} | {fmt(v[b])} |"
                  f" {mean(v[b]) / mean(v['A']):.3f} |")
