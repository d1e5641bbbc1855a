"""Benchmark cells: the FA-grid and HSTU-grid of TARGETS.md, their inputs and their FLOP counts."""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HSTU_TOKENS = 512 * 1024  # total tokens per HSTU cell (TARGETS.md: ~0.5M)
HSTU_MAX_TARGETS = 20


@dataclass(frozen=True)
class Cell:
    kind: str  # "fa" (softmax, fixed layout) or "hstu" (jagged)
    dtype: str
    d: int
    seqlen: int  # fa: s_q = s_k; hstu: max_seqlen
    batch: int
    heads: int
    causal: bool = True
    targets: bool = False  # hstu: up to HSTU_MAX_TARGETS targets per sequence
    rab: bool = False  # hstu: a (b, 1, max, max) relative attention bias with its gradient
    dense: bool = False  # hstu: every sequence max_seqlen long (the grid draws lengths in [0.9 max, max])

    @property
    def key(self) -> str:
        extra = f"-targets{int(self.targets)}-rab{int(self.rab)}" if self.kind == "hstu" else ""
        extra += "-dense" if self.dense else ""
        shape = f"d{self.d}-s{self.seqlen}-b{self.batch}-h{self.heads}"
        return f"{self.kind}-{self.dtype}-{shape}-c{int(self.causal)}{extra}"

    def as_dict(self) -> Dict:
        return asdict(self)


def fa_cell(dtype: str, d: int, s: int, causal: bool, batch: Optional[int] = None, heads: Optional[int] = None):
    return Cell("fa", dtype, d, s, batch or max(1, 16384 // s), heads or max(1, 2048 // d), causal)


def hstu_cell(d: int, max_len: int, targets: bool, rab: bool, dtype="bf16", batch=None, heads=4, causal=True,
              dense=False):  # fmt: skip
    batch = batch or max(1, round(HSTU_TOKENS / ((1.0 if dense else 0.95) * max_len)))
    return Cell("hstu", dtype, d, max_len, batch, heads, causal, targets, rab, dense)


def fa_grid(quick: bool, dtypes=("bf16", "fp16")) -> List[Cell]:
    if quick:
        return [fa_cell("bf16", d, s, c) for d, s in ((64, 1024), (128, 1024), (128, 4096), (256, 2048))
                for c in (False, True)]  # fmt: skip
    return [fa_cell(dt, d, s, c) for dt in dtypes for d in (64, 128, 256)
            for s in (512, 1024, 2048, 4096, 8192, 16384) for c in (False, True)]  # fmt: skip


def hstu_grid(quick: bool) -> List[Cell]:
    if quick:
        return [hstu_cell(128, m, t, r) for m in (1024, 4096) for t, r in ((False, False), (True, True))]
    return [hstu_cell(d, m, t, r) for d in (128, 256) for m in (1024, 2048, 4096, 8192)
            for t in (False, True) for r in (False, True)]  # fmt: skip


class Inputs:
    """Random normal inputs of a cell on the GPU; the same cell always gets the same tensors (seeded by its key),
    so a child process rebuilds them exactly."""

    def __init__(self, cell: Cell, device: torch.device):
        gen = torch.Generator(device=device).manual_seed(zlib.crc32(cell.key.encode()))
        dtype = DTYPES[cell.dtype]

        def randn(*shape):
            return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

        self.cell = cell
        self.cu_seqlens = self.num_targets = self.rab = None
        if cell.kind == "fa":
            shape = (cell.batch, cell.seqlen, cell.heads, cell.d)
            self.q, self.k, self.v = randn(*shape), randn(*shape), randn(*shape)
            self.lengths = [cell.seqlen] * cell.batch
        else:
            lo = cell.seqlen if cell.dense else int(0.9 * cell.seqlen)
            lengths = torch.randint(lo, cell.seqlen + 1, (cell.batch,), generator=gen, device=device)
            self.lengths = lengths.tolist()
            self.cu_seqlens = torch.zeros(cell.batch + 1, dtype=torch.int32, device=device)
            self.cu_seqlens[1:] = torch.cumsum(lengths, 0)
            total = int(self.cu_seqlens[-1])
            self.q, self.k, self.v = (randn(total, cell.heads, cell.d) for _ in range(3))
            if cell.targets:
                self.num_targets = torch.randint(0, HSTU_MAX_TARGETS + 1, (cell.batch,), generator=gen,
                                                 device=device).to(torch.int32)  # fmt: skip
            if cell.rab:
                self.rab = randn(cell.batch, 1, cell.seqlen, cell.seqlen)
        out_shape = self.q.shape
        self.dout = randn(*out_shape)

    def differentiable(self) -> List[torch.Tensor]:
        return [self.q, self.k, self.v] + ([self.rab] if self.rab is not None else [])


def flops(cell: Cell, lengths: List[int]) -> Dict[str, float]:
    """FlashAttention convention: forward 4 * h * s_q * s_k * d per sequence (2 * (d + d_v) in general), halved
    when causal; backward 2.5 x forward. Jagged: each sequence with its own length."""
    per_pair = 2.0 * cell.heads * (cell.d + cell.d)
    fwd = sum(per_pair * n * n for n in lengths)
    if cell.causal:
        fwd /= 2
    return {"fwd": fwd, "bwd": 2.5 * fwd}
