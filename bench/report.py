#!/usr/bin/env python3
"""Benchmark results: run metadata, ratios, and the files (JSON, CSV, markdown report with the worst ratios
first, PNG plots of TFLOP/s vs seqlen with ratio panels). `python bench/report.py <results.json>` rewrites the
CSV, report and plots of an earlier run (e.g. on a machine that has matplotlib)."""

from __future__ import annotations

import csv
import datetime
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

OURS = "cuteattn"
REPO = Path(__file__).resolve().parent.parent


def _run(cmd: List[str]) -> Optional[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=REPO).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _version(module: str) -> Optional[str]:
    try:
        return getattr(__import__(module), "__version__", "unknown")
    except ImportError:
        return None


def environment(commit: Optional[str], impls: List[str]) -> Dict:
    import torch

    import cuteattn

    if commit is None:
        commit = _run(["git", "rev-parse", "--short=12", "HEAD"]) or os.environ.get("CUTEATTN_COMMIT", "unknown")
        if commit != "unknown" and _run(["git", "status", "--porcelain", "--untracked-files=no"]):
            commit += "-dirty"
    props = torch.cuda.get_device_properties(0)
    return {
        "device": torch.cuda.get_device_name(0),
        "sm_count": props.multi_processor_count,
        "memory_gb": round(props.total_memory / 2**30, 1),
        "driver": _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "triton": _version("triton"),
        "flash_attn": _version("flash_attn"),
        "cuteattn": cuteattn.__version__,
        "cuteattn_archs": cuteattn.compiled_archs(),
        "implementations": impls,
        "flops": "FlashAttention convention: fwd 4*b*h*s_q*s_k*d (2*(d+d_v) in general), halved for causal; "
        "bwd 2.5 x fwd; jagged: per sequence with its own length",
        "timing": "median of CUDA-event timed runs after warm-up, L2 flushed before each run",
        "cells": [],
    }


def ratios(entry: Dict) -> Dict[str, Dict[str, float]]:
    """ours / peer in throughput (= peer time / our time) per peer and direction, where both ran."""
    ours = entry["results"].get(OURS, {})
    out: Dict[str, Dict[str, float]] = {}
    for name, res in entry["results"].items():
        if name == OURS:
            continue
        for direction, m in res.items():
            if isinstance(m, dict) and "ms" in m and "ms" in ours.get(direction, {}):
                out.setdefault(name, {})[direction] = m["ms"] / ours[direction]["ms"]
    return out


def _stem(run: Dict, tag: str) -> str:
    device = re.sub(r"[^a-z0-9]+", "-", run["device"].lower()).strip("-")
    return f"{device}-{run['date'][:10].replace('-', '')}-{run['commit']}" + (f"-{tag}" if tag else "")


def _rows(run: Dict):
    for c in run["cells"]:
        for name, res in c["results"].items():
            if "skipped" in res:
                continue
            for direction, m in res.items():
                if "skipped" not in m:  # a direction an isolated peer did not run (run_bench.CrashMemo)
                    yield c, name, direction, m


def write_csv(run: Dict, path: Path):
    fields = ["kind", "dtype", "d", "seqlen", "batch", "heads", "causal", "targets", "rab", "impl", "direction",
              "ms", "tflops", "fraction_of_matmul", "peak_mb", "check", "ratio_ours_over_impl", "error"]  # fmt: skip
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for c, name, direction, m in _rows(run):
            row = {k: c["cell"][k] for k in fields[:9]}
            check = m.get("check")
            ceiling = run.get("matmul_tflops", {}).get(c["cell"]["dtype"])
            fraction = m["tflops"] / ceiling if ceiling and m.get("tflops") else None
            row.update(impl=name, direction=direction, ms=m.get("ms"), tflops=m.get("tflops"),
                       fraction_of_matmul=fraction, peak_mb=m.get("peak_mb"),
                       check=None if check is None else ("ok" if check["ok"] else "FAIL"),
                       ratio_ours_over_impl=c["ratios"].get(name, {}).get(direction), error=m.get("error"))  # fmt: skip
            w.writerow(row)


def _ceilings(run: Dict) -> str:
    return ", ".join(f"{dt} {t:.0f}" for dt, t in run.get("matmul_tflops", {}).items()) or "not measured"


def _fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def _failed_item(item: Dict) -> str:
    if "err" not in item:
        return f"{item['name']}: {item.get('why')}"
    return f"{item['name']} err {item['err']:.3g} > {item['factor']} x plain {item['plain_err']:.3g}"


def markdown(run: Dict) -> str:
    lines = [f"# cuteattn benchmark: {run['device']}, {run['date']}, commit {run['commit']}", ""]
    lines += [f"driver {run['driver']}, torch {run['torch']} (CUDA {run['cuda']}, cuDNN {run['cudnn']}), "
              f"triton {run['triton']}, flash_attn {run['flash_attn']}, cuteattn {run['cuteattn']} "
              f"(archs {run['cuteattn_archs']}, kernels: {run.get('cuteattn_backend', 'auto')})", "",
              f"Matmul ceiling (cuBLAS 8192^3, same run), TFLOP/s: {_ceilings(run)}.", "", f"FLOPs: {run['flops']}.", f"Timing: {run['timing']}.", ""]
    worst = sorted(((r, c["key"], peer, d) for c in run["cells"] for peer, dirs in c["ratios"].items()
                    for d, r in dirs.items()), key=lambda t: t[0])  # fmt: skip
    lines += ["## Ratios ours/peer, worst first", "", "| ratio | cell | direction | peer |", "|---|---|---|---|"]
    lines += [f"| {r:.2f} | {key} | {d} | {peer} |" for r, key, peer, d in worst]
    problems = []
    for c, name, direction, m in _rows(run):
        if "error" in m:
            problems.append(f"| {c['key']} | {name} | {direction} | error: {m['error']} |")
        elif m.get("check") and not m["check"]["ok"]:
            bad = [_failed_item(i) for i in m["check"]["items"] if not i["ok"]]
            problems.append(f"| {c['key']} | {name} | {direction} | check failed: {'; '.join(bad)} |")
    for c in run["cells"]:
        for name, res in c["results"].items():
            problems += [f"| {c['key']} | {name} | {d} | {m['skipped']} |" for d, m in res.items()
                         if isinstance(m, dict) and "skipped" in m]  # fmt: skip
    lines += ["", "## Errors, failed checks, directions not run", ""]
    lines += (["| cell | impl | direction | what |", "|---|---|---|---|"] + problems) if problems else ["none"]
    impls = run["implementations"]
    lines += ["", "## TFLOP/s per cell", "", "| cell | dir | " + " | ".join(impls) + " |",
              "|---|---|" + "---|" * len(impls)]  # fmt: skip
    for c in run["cells"]:
        for d in ("fwd", "bwd"):
            vals = []
            for name in impls:
                m = c["results"].get(name, {}).get(d) if "skipped" not in c["results"].get(name, {}) else None
                vals.append(_fmt(m.get("tflops")) if m and "tflops" in m else
                            ("skip" if m and "skipped" in m else ("err" if m else "-")))  # fmt: skip
            if any(v != "-" for v in vals):
                lines.append(f"| {c['key']} | {d} | " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


def plots(run: Dict, stem: Path) -> List[Path]:
    """One figure per (kind, dtype, direction): a column per (d, variant) with TFLOP/s vs seqlen on top and the
    ratio ours/peer below."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib not installed, no plots (python bench/report.py <json> later)", file=sys.stderr)
        return []
    groups = defaultdict(list)
    for c in run["cells"]:
        cell = c["cell"]
        groups[(cell["kind"], cell["dtype"])].append(c)
    paths = []
    for (kind, dtype), cells in sorted(groups.items()):
        for direction in ("fwd", "bwd"):
            panels = sorted({(c["cell"]["d"], _variant(c["cell"])) for c in cells})
            fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 6.5), squeeze=False,
                                     gridspec_kw={"height_ratios": [2, 1]}, sharex="col")  # fmt: skip
            drawn = False
            for col, (d, variant) in enumerate(panels):
                sel = sorted((c for c in cells if c["cell"]["d"] == d and _variant(c["cell"]) == variant),
                             key=lambda c: c["cell"]["seqlen"])  # fmt: skip
                top, bottom = axes[0][col], axes[1][col]
                for index, name in enumerate(run["implementations"]):
                    color = f"C{index}"  # one colour per implementation in both panels
                    pts = [(c["cell"]["seqlen"], c["results"].get(name, {}).get(direction, {}).get("tflops"))
                           for c in sel]  # fmt: skip
                    pts = [(s, t) for s, t in pts if t is not None]
                    if pts:
                        drawn = True
                        top.plot(*zip(*pts), marker="o", color=color, label=name,
                                 linewidth=2.5 if name == OURS else 1.2)
                    rs = [(c["cell"]["seqlen"], c["ratios"].get(name, {}).get(direction)) for c in sel]
                    rs = [(s, r) for s, r in rs if r is not None]
                    if rs:
                        bottom.plot(*zip(*rs), marker="o", color=color, label=f"vs {name}")
                top.set_title(f"d={d} {variant}")
                ceiling = run.get("matmul_tflops", {}).get(dtype)
                if ceiling:  # right axis: the same TFLOP/s as a fraction of the measured matmul ceiling
                    frac = top.secondary_yaxis("right", functions=(lambda t, c=ceiling: t / c,
                                                                   lambda f, c=ceiling: f * c))  # fmt: skip
                    frac.set_ylabel("fraction of matmul")
                top.set_xscale("log", base=2)
                top.set_ylabel("TFLOP/s")
                bottom.axhline(1.0, color="gray", linewidth=0.8)
                bottom.set_ylabel("ours / peer")
                bottom.set_xlabel("max seqlen" if kind == "hstu" else "seqlen")
                top.grid(alpha=0.3)
                bottom.grid(alpha=0.3)
            if not drawn:
                plt.close(fig)
                continue
            for ax in (axes[0][0], axes[1][0]):
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize=8)
            fig.suptitle(f"{kind} {dtype} {direction} - {run['device']} - {run['commit']}")
            fig.tight_layout()
            path = Path(f"{stem}-{kind}-{dtype}-{direction}.png")
            fig.savefig(path, dpi=110)
            plt.close(fig)
            paths.append(path)
    return paths


def _variant(cell: Dict) -> str:
    parts = ["causal" if cell["causal"] else "full"]
    if cell["kind"] == "hstu":
        parts += ["targets"] * bool(cell["targets"]) + ["rab"] * bool(cell["rab"]) + ["dense"] * bool(cell.get("dense"))
    return "+".join(parts)


def write_all(run: Dict, out: Path, tag: str = "", with_json: bool = True) -> List[Path]:
    """Writes <device>-<date>-<commit>[-<tag>].{json,csv,md} and the plots; tag names partial runs."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / _stem(run, tag)
    paths = []
    if with_json:
        paths.append(stem.with_suffix(".json"))
        paths[-1].write_text(json.dumps(run, indent=1) + "\n")
    write_csv(run, stem.with_suffix(".csv"))
    stem.with_suffix(".md").write_text(markdown(run))
    paths += [stem.with_suffix(".csv"), stem.with_suffix(".md")] + plots(run, stem)
    return paths


def summary(run: Dict) -> str:
    """A few lines for a terminal: per direction and peer, the worst and median ratio, and problems."""
    by = defaultdict(list)
    for c in run["cells"]:
        for peer, dirs in c["ratios"].items():
            for d, r in dirs.items():
                by[(d, peer)].append((r, c["key"]))
    lines = [f"{run['device']} commit {run['commit']}: {len(run['cells'])} cells"]
    for c in run["cells"][:12]:  # absolute numbers for small runs
        ours = c["results"].get(OURS, {})
        tf = ", ".join(f"{d} {m['tflops']:.0f}" for d, m in ours.items() if "tflops" in m)
        lines.append(f"  {c['key']}: cuteattn TFLOP/s {tf or '-'}")
    for (d, peer), rs in sorted(by.items()):
        rs.sort()
        lines.append(f"  {d} vs {peer:15s} worst {rs[0][0]:.2f} ({rs[0][1]})  median {rs[len(rs) // 2][0]:.2f}")
    bad = sum(1 for c, n, d, m in _rows(run) if n == OURS and ("error" in m or not m.get("check", {}).get("ok", 1)))
    lines.append(f"  cuteattn errors or failed checks: {bad}")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/report.py <results.json>")
    src = Path(sys.argv[1])
    result = json.loads(src.read_text())
    stem = _stem(result, "")
    for p in write_all(result, src.parent, tag=src.stem[len(stem) + 1:], with_json=False):
        print(f"wrote {p}")
