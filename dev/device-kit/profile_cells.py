"""Time per kernel of our forward and backward on benchmark cells (torch profiler, CUDA activity): where a
direction's time goes, beside the main kernel (conversion passes, memsets, dRab passes). Takes run_bench.py's cell
arguments, e.g.
    python3 dev/device-kit/profile_cells.py --kind hstu --d 128 --rab --seqlen 1024,4096
    python3 dev/device-kit/profile_cells.py --kind fa --d 128 --seqlen 1024 --backend sm90
Each direction runs `--reps` times after two warm-up runs, back to back (no L2 flush); times are per run."""

import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from cells import Inputs  # noqa: E402
from peers import Cuteattn  # noqa: E402
from run_bench import parse_args, select_cells  # noqa: E402


def kernel_times(run, reps: int):
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    rows = [(e.self_device_time_total / reps, e.key) for e in prof.key_averages() if e.self_device_time_total > 0]
    return sorted(rows, reverse=True)


def main():
    argv = sys.argv[1:]
    reps = 5
    if "--reps" in argv:
        i = argv.index("--reps")
        reps = int(argv[i + 1])
        del argv[i : i + 2]
    args = parse_args(argv)
    device = torch.device("cuda")
    for cell in select_cells(args):
        inputs = Inputs(cell, device)
        fn = Cuteattn(args.backend).make(inputs)
        leaves = [t.detach().requires_grad_() for t in inputs.differentiable()]
        runs = {"fwd": lambda: fn(*[t.detach() for t in leaves])}
        if "bwd" in args.directions:
            out = fn(*leaves)
            runs["bwd"] = lambda: torch.autograd.grad(out, leaves, inputs.dout, retain_graph=True)
        for direction, run in runs.items():
            if direction not in args.directions:
                continue
            rows = kernel_times(run, reps)
            total = sum(t for t, _ in rows)
            print(f"== {cell.key} {direction}: {total / 1000:.3f} ms of kernels per run")
            for t, name in rows[:10]:
                print(f"  {t / 1000:8.3f} ms {100 * t / total:5.1f}%  {name[:110]}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
