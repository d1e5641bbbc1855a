#!/usr/bin/env python3
"""cuteattn benchmark (TARGETS.md protocol): cuteattn and its peers in one process on the same tensors, each
output checked once against the float64 reference, CUDA-event median times, TFLOP/s, peak memory, and the
ratio ours/peer per cell. Writes <device>-<date>-<commit>.{json,csv,md} and PNG plots to --out.

  python bench/run_bench.py --quick                         # the device-check subset
  python bench/run_bench.py --grid fa --grid hstu           # both full grids
  python bench/run_bench.py --kind fa --d 128 --seqlen 16384 --causal   # one cell
  python bench/run_bench.py --grid hstu --triton-hstu ~/generative-recommenders --warm-jobs 12

Isolated peers (the Triton HSTU kernel) run each measurement in a fresh process. `--warm-jobs N` first runs
every such measurement once, N processes at a time and untimed (the shortest sequence of each head dim first),
so that their compile caches (Triton compiles every autotune config on first use) fill in parallel instead of
one cell after another. An isolated direction whose process crashed at some max_seqlen, in the warm-up or
timed, is not run again at that head dim for equal or longer sequences; the report says why.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from cells import DTYPES, Cell, Inputs, fa_cell, fa_grid, flops, hstu_cell, hstu_grid  # noqa: E402
from measure import Timer, check, matmul_ceiling, peak_mb  # noqa: E402
from peers import OURS, Impl, available  # noqa: E402
import report  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", action="append", choices=["fa", "hstu"], help="full grid(s) to run (repeatable)")
    p.add_argument("--quick", action="store_true", help="a small subset of both grids (device check)")
    p.add_argument("--grid-dtypes", default="bf16,fp16", help="element types of the full FA-grid")
    p.add_argument("--grid-hdims", help="only these head dims of the full grids (comma-separated)")
    cell = p.add_argument_group("single cell (instead of a grid)")
    cell.add_argument("--kind", choices=["fa", "hstu"])
    cell.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    cell.add_argument("--d", type=int, default=128)
    cell.add_argument("--seqlen", default="4096", help="fa: s_q = s_k; hstu: max_seqlen; a comma-separated list "
                      "runs a cell per value")
    cell.add_argument("--batch", type=int, help="default: 16384 / s (fa), ~0.5M tokens (hstu)")
    cell.add_argument("--heads", type=int, help="default: 2048 / d (fa), 4 (hstu)")
    cell.add_argument("--causal", action=argparse.BooleanOptionalAction, help="default: off (fa), on (hstu)")
    cell.add_argument("--targets", action="store_true", help="hstu: up to 20 targets per sequence")
    cell.add_argument("--rab", action="store_true", help="hstu: relative attention bias with gradient")
    cell.add_argument("--dense", action="store_true", help="hstu: every sequence max_seqlen long")
    p.add_argument("--directions", default="fwd,bwd", help="fwd, bwd or fwd,bwd")
    p.add_argument("--peers", help="comma-separated subset of implementations (default: all available)")
    p.add_argument("--backend", default="auto", choices=["auto", "sm80", "sm90"],
                   help="cuteattn's kernel family (default: what dispatch picks)")
    p.add_argument("--triton-hstu", metavar="DIR", help="folder of a generative-recommenders checkout")
    p.add_argument("--no-check", action="store_true", help="skip the output checks")
    p.add_argument("--target-ms", type=float, default=300.0, help="timed milliseconds per measurement")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--commit", help="commit id for the file name (default: git, else $CUTEATTN_COMMIT)")
    p.add_argument("--child-timeout", type=float, default=900.0, help="seconds for one isolated measurement")
    p.add_argument("--warm-jobs", type=int, default=0,
                   help="fill the isolated peers' compile caches first, this many processes at a time")
    p.add_argument("--child", help=argparse.SUPPRESS)  # JSON cell: measure one implementation, print RESULT
    p.add_argument("--child-impl", help=argparse.SUPPRESS)
    p.add_argument("--child-warm", action="store_true", help=argparse.SUPPRESS)  # run once, untimed
    return p.parse_args(argv)


def select_cells(args) -> List[Cell]:
    seqlens = [int(x) for x in str(args.seqlen).split(",")]
    if args.kind == "fa":
        return [fa_cell(args.dtype, args.d, s, bool(args.causal), args.batch, args.heads) for s in seqlens]
    if args.kind == "hstu":
        causal = args.causal is not False
        return [hstu_cell(args.d, s, args.targets, args.rab, args.dtype, args.batch, args.heads or 4, causal,
                          args.dense) for s in seqlens]  # fmt: skip
    grids = set(args.grid or (["fa", "hstu"] if args.quick else []))
    if not grids:
        raise SystemExit("nothing to run: give --quick, --grid fa|hstu or a cell (--kind ...)")
    cells = []
    if "fa" in grids:
        cells += fa_grid(args.quick, args.grid_dtypes.split(","))
    if "hstu" in grids:
        cells += hstu_grid(args.quick)
    if args.grid_hdims:
        cells = [c for c in cells if str(c.d) in args.grid_hdims.split(",")]
    return cells


def measure(impl: Impl, inputs: Inputs, directions: List[str], timer: Timer, do_check: bool) -> Dict:
    """Times one implementation on one cell in this process: {direction: {ms, tflops, peak_mb, check} | error}."""
    fn = impl.make(inputs)
    args = [inputs.q, inputs.k, inputs.v] + ([inputs.rab] if impl.name == OURS and inputs.rab is not None else [])
    flop = flops(inputs.cell, inputs.lengths)
    result = {}
    for direction in directions:
        try:
            call = _timed_call(fn, args, direction, inputs.dout)
            first = call()
            entry = {"check": check(inputs, direction, args, first)} if do_check else {}
            del first
            entry["peak_mb"] = round(peak_mb(call), 1)
            entry["ms"] = timer.median_ms(call)
            entry["tflops"] = flop[direction] / entry["ms"] / 1e9
            result[direction] = entry
        except torch.cuda.OutOfMemoryError:
            result[direction] = {"error": "out of memory"}
        except Exception as e:  # a peer refusing a cell (no kernel for it) is a result, not a crash
            result[direction] = {"error": f"{type(e).__name__}: {e}".strip()[:400]}
        finally:
            call = None  # frees the forward graph of a backward measurement
            torch.cuda.empty_cache()
    return result


def _timed_call(fn, args: List[torch.Tensor], direction: str, dout: torch.Tensor):
    """What one timed run executes, returning its outputs: the forward without autograd, or the backward of
    one recorded forward."""
    if direction == "fwd":

        def forward():
            with torch.no_grad():
                return [fn(*args)]

        return forward
    leaves = [t.detach().requires_grad_() for t in args]
    out = fn(*leaves)
    return lambda: list(torch.autograd.grad(out, leaves, dout, retain_graph=True))


def child_command(cell: Cell, impl: Impl, direction: str, args) -> List[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cell.as_dict()), "--child-impl",
           impl.name, "--directions", direction, "--target-ms", str(args.target_ms)]  # fmt: skip
    if args.triton_hstu:
        cmd += ["--triton-hstu", args.triton_hstu]
    if args.no_check:
        cmd.append("--no-check")
    return cmd


def run_child(cmd: List[str], timeout: float) -> Dict:
    """Runs a child process: its RESULT line as a dict ({} when it printed none and exited 0), or an error."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    if proc.returncode == 0:
        return {}
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"child exited {proc.returncode}: " + " | ".join(tail)[:400]}


def measure_in_child(cell: Cell, impl: Impl, direction: str, args) -> Dict:
    """Runs one implementation and direction in a fresh process, so a kernel that corrupts the CUDA context
    cannot take the rest of the run with it (the tensors are rebuilt from the cell's seed)."""
    result = run_child(child_command(cell, impl, direction, args), args.child_timeout)
    entry = result if "error" in result else result[direction]
    entry["isolated"] = True
    return entry


class CrashMemo:
    """Remembers where an isolated peer's direction crashed (its process died), so the same head dim is not
    run again at equal or longer sequences: each such crash costs a fresh process and a full autotune."""

    def __init__(self):
        self.crashed: Dict[tuple, tuple] = {}  # key -> (cell, error)

    @staticmethod
    def key(cell: Cell, impl: Impl, direction: str) -> tuple:
        return (impl.name, direction, cell.kind, cell.dtype, cell.d)

    def reason(self, cell: Cell, impl: Impl, direction: str) -> Optional[str]:
        seen = self.crashed.get(self.key(cell, impl, direction))
        if seen is not None and cell.seqlen >= seen[0].seqlen:
            return f"not run: its process crashed at max_seqlen {seen[0].seqlen} ({seen[0].key}): {seen[1]}"
        return None

    def record(self, cell: Cell, impl: Impl, direction: str, entry: Dict):
        if entry.get("error", "").startswith("child exited"):
            key = self.key(cell, impl, direction)
            if key not in self.crashed or cell.seqlen < self.crashed[key][0].seqlen:
                self.crashed[key] = (cell, entry["error"])


def warm_isolated(cells: List[Cell], impls: Dict[str, Impl], directions: List[str], args, crashes: CrashMemo):
    """Runs every isolated measurement once, untimed, args.warm_jobs processes at a time: first the shortest
    sequence of each head dim, then the rest that did not crash there. Crashes go to the memo."""
    jobs = [(c, i, d) for c in cells for i in impls.values() if i.isolate and not i.supports(c) for d in directions]
    shortest: Dict[tuple, int] = {}
    for job in jobs:
        shortest[CrashMemo.key(*job)] = min(shortest.get(CrashMemo.key(*job), job[0].seqlen), job[0].seqlen)
    first = [job for job in jobs if job[0].seqlen == shortest[CrashMemo.key(*job)]]
    t0, count = time.time(), 0
    for stage in (first, [job for job in jobs if job not in first]):
        todo = [job for job in stage if not crashes.reason(*job)]
        count += len(todo)
        with ThreadPoolExecutor(args.warm_jobs) as pool:
            outcomes = list(pool.map(lambda job: run_child(child_command(*job, args) + ["--child-warm"],
                                                           args.child_timeout), todo))  # fmt: skip
        for job, outcome in zip(todo, outcomes):
            crashes.record(*job, outcome)
    print(f"warmed {count} isolated measurements in {time.time() - t0:.0f} s", file=sys.stderr)


def isolated(cell: Cell, impl: Impl, direction: str, args, crashes: CrashMemo) -> Dict:
    reason = crashes.reason(cell, impl, direction)
    if reason:
        return {"skipped": reason}
    entry = measure_in_child(cell, impl, direction, args)
    crashes.record(cell, impl, direction, entry)
    return entry


class Progress:
    """A one-line progress bar on stderr (a line per step when stderr is not a terminal)."""

    def __init__(self, total: int):
        self.total, self.done, self.t0 = total, 0, time.time()
        self.tty = sys.stderr.isatty()

    def step(self, label: str):
        self.done += 1
        elapsed = time.time() - self.t0
        eta = elapsed / self.done * (self.total - self.done)
        width = 30
        bar = "#" * (width * self.done // self.total)
        line = f"[{bar:<{width}}] {self.done}/{self.total} {label}  {elapsed:5.0f}s elapsed, ~{eta:4.0f}s left"
        sys.stderr.write(("\r" + line + "\033[K") if self.tty else line + "\n")
        if self.tty and self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def child_main(args):
    cell = Cell(**json.loads(args.child))
    impls = available(args.triton_hstu, None, args.backend)
    inputs = Inputs(cell, torch.device("cuda"))
    if args.child_warm:
        warm(impls[args.child_impl], inputs, args.directions.split(","))
        return
    timer = Timer(torch.device("cuda"), args.target_ms)
    result = measure(impls[args.child_impl], inputs, args.directions.split(","), timer, not args.no_check)
    print("RESULT " + json.dumps(result), flush=True)


def warm(impl: Impl, inputs: Inputs, directions: List[str]):
    fn = impl.make(inputs)
    for direction in directions:
        _timed_call(fn, [inputs.q, inputs.k, inputs.v], direction, inputs.dout)()
    torch.cuda.synchronize()


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("run_bench.py needs a CUDA device")
    if args.child:
        return child_main(args)
    directions = args.directions.split(",")
    impls = available(args.triton_hstu, args.peers.split(",") if args.peers else None, args.backend)
    cells = select_cells(args)
    device = torch.device("cuda")
    timer = Timer(device, args.target_ms)
    run = report.environment(args.commit, list(impls))
    run["cuteattn_backend"] = args.backend
    run["matmul_tflops"] = {dt: round(matmul_ceiling(timer, DTYPES[dt]), 1) for dt in sorted({c.dtype for c in cells})}
    crashes = CrashMemo()
    if args.warm_jobs > 0:
        warm_isolated(cells, impls, directions, args, crashes)
    progress = Progress(len(cells) * len(impls))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for cell in cells:
        inputs = Inputs(cell, device)
        entry = {"key": cell.key, "cell": cell.as_dict(), "flops": flops(cell, inputs.lengths), "results": {}}
        for name, impl in impls.items():
            reason = impl.supports(cell)
            if reason:
                entry["results"][name] = {"skipped": reason}
            elif impl.isolate:
                entry["results"][name] = {d: isolated(cell, impl, d, args, crashes) for d in directions}
            else:
                entry["results"][name] = measure(impl, inputs, directions, timer, not args.no_check)
            progress.step(f"{cell.key} {name}")
        entry["ratios"] = report.ratios(entry)
        run["cells"].append(entry)
        # Kept up to date cell by cell, so a run stopped early still leaves its measurements.
        (Path(args.out) / "partial.json").write_text(json.dumps(run, indent=1))
        del inputs
        torch.cuda.empty_cache()
    tag = "quick" if args.quick else ""
    if args.kind:  # a single cell's key, or the shared part of a list of sequence lengths
        first = cells[0]
        tag = first.key if len(cells) == 1 else "-".join(
            [first.kind, first.dtype, f"d{first.d}", "s" + "_".join(str(c.seqlen) for c in cells)] +
            ["dense"] * first.dense)  # fmt: skip
    if args.backend != "auto":
        tag = "-".join(t for t in (args.backend, tag) if t)
    paths = report.write_all(run, Path(args.out), tag=tag)
    print(report.summary(run))
    for p in paths:
        print(f"wrote {p}")
    failed = [(c["key"], n, d) for c in run["cells"] for n, r in c["results"].items() if n == OURS
              for d, e in r.items() if "error" in e or not e.get("check", {}).get("ok", True)]  # fmt: skip
    if failed:
        print(f"cuteattn failed or was wrong in {len(failed)} measurements: {failed[:5]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
