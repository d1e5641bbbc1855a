"""The benchmark's bookkeeping without a GPU: ratios, the crash memo of isolated peers, and reports of runs in
which a peer skipped a direction."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import report  # noqa: E402
import run_bench  # noqa: E402
from cells import hstu_cell  # noqa: E402
from peers import Impl  # noqa: E402
from run_bench import CrashMemo  # noqa: E402


class _Peer(Impl):
    name = "peer"
    isolate = True


def _run(cells):
    return {"device": "Test GPU", "date": "2026-11-22T00:00:00Z", "commit": "abc1234", "driver": "-", "torch": "-",
            "cuda": "-", "cudnn": "-", "triton": "-", "flash_attn": None, "cuteattn": "-", "cuteattn_archs": [],
            "implementations": ["cuteattn", "peer"], "flops": "-", "timing": "-", "matmul_tflops": {"bf16": 800.0},
            "cells": cells}  # fmt: skip


def test_crash_memo_skips_equal_or_longer_sequences_of_the_same_head_dim():
    memo, peer = CrashMemo(), _Peer()
    short, long, other_d = hstu_cell(128, 1024, False, False), hstu_cell(128, 2048, True, False), hstu_cell(
        256, 2048, False, False)
    memo.record(short, peer, "bwd", {"error": "child exited -6: illegal memory access", "isolated": True})
    assert memo.reason(short, peer, "bwd") and memo.reason(long, peer, "bwd")
    assert memo.reason(long, peer, "fwd") is None
    assert memo.reason(other_d, peer, "bwd") is None
    assert "illegal memory access" in memo.reason(long, peer, "bwd")
    memo.record(other_d, peer, "fwd", {"error": "timed out after 900 s"})  # not a crash
    assert memo.reason(other_d, peer, "fwd") is None


def test_warm_up_runs_the_shortest_sequences_first_and_not_past_a_crash(monkeypatch):
    cells = [hstu_cell(128, s, False, False) for s in (2048, 1024, 4096)]
    ran = []

    def fake_child(cmd, timeout):
        cell, direction = json.loads(cmd[cmd.index("--child") + 1]), cmd[cmd.index("--directions") + 1]
        ran.append((cell["seqlen"], direction))
        return {"error": "child exited 1: illegal memory access"} if direction == "bwd" else {}

    monkeypatch.setattr(run_bench, "run_child", fake_child)
    args = run_bench.parse_args(["--grid", "hstu", "--warm-jobs", "1"])
    memo = CrashMemo()
    run_bench.warm_isolated(cells, {"peer": _Peer()}, ["fwd", "bwd"], args, memo)
    assert ran[:2] == [(1024, "fwd"), (1024, "bwd")]
    assert sorted(ran[2:]) == [(2048, "fwd"), (4096, "fwd")]
    assert memo.reason(cells[0], _Peer(), "bwd") and memo.reason(cells[0], _Peer(), "fwd") is None


def test_reports_list_skipped_directions_and_keep_ratios(tmp_path):
    cell = hstu_cell(128, 1024, False, False)
    entry = {"key": cell.key, "cell": cell.as_dict(), "flops": {"fwd": 1e12, "bwd": 2.5e12},
             "results": {"cuteattn": {"fwd": {"ms": 2.0, "tflops": 500.0}, "bwd": {"ms": 10.0, "tflops": 250.0}},
                         "peer": {"fwd": {"ms": 3.0, "tflops": 333.3}, "bwd": {"skipped": "not run: crashed"}}}}
    entry["ratios"] = report.ratios(entry)
    assert entry["ratios"] == {"peer": {"fwd": 1.5}}
    paths = report.write_all(_run([entry]), tmp_path, tag="t")
    md = next(p for p in paths if p.suffix == ".md").read_text()
    assert "| peer | bwd | not run: crashed |" in md and "| skip |" in md
    csv_text = next(p for p in paths if p.suffix == ".csv").read_text()
    assert csv_text.count("\n") == 4  # header + three measured rows; the skipped direction has none
    assert json.loads(next(p for p in paths if p.suffix == ".json").read_text())["cells"][0]["ratios"]
