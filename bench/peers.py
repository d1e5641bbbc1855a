"""The implementations a cell is timed with: cuteattn and its peers (PyTorch SDPA backends, flash_attn when
importable, the generative-recommenders Triton HSTU kernel from a folder). Each turns a cell's Inputs into a
callable of the differentiable tensors, so every implementation runs on the very same tensors."""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

import cuteattn
from cells import Cell, Inputs

OURS = "cuteattn"


class Impl:
    name = ""
    isolate = False  # run in a child process (kernels known to corrupt the CUDA context)

    def supports(self, cell: Cell) -> Optional[str]:
        """None when the implementation can run the cell, else why not."""
        return None

    def make(self, inputs: Inputs) -> Callable:
        raise NotImplementedError


class Cuteattn(Impl):
    name = OURS

    def __init__(self, backend: str = "auto"):
        self.backend = backend  # "auto", or one kernel family forced ("sm80", "sm90")

    def make(self, inputs: Inputs) -> Callable:
        cell = inputs.cell
        backend = self.backend
        if cell.kind == "fa":
            return lambda q, k, v: cuteattn.flash_attn_func(q, k, v, causal=cell.causal, backend=backend)
        max_len = cell.seqlen  # rab is (b, 1, seqlen, seqlen); scaling_seqlen defaults to it, as Triton's N

        def hstu(q, k, v, rab=None):
            return cuteattn.hstu_attn_varlen_func(
                q, k, v, inputs.cu_seqlens, inputs.cu_seqlens, max_len, max_len,
                num_targets=inputs.num_targets, alpha=1.0 / cell.d, rab=rab, has_drab=rab is not None,
                causal=cell.causal, backend=backend)  # fmt: skip

        return hstu


class Sdpa(Impl):
    def __init__(self, backend_name: str):
        from torch.nn.attention import SDPBackend

        self.backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend_name]  # fmt: skip
        self.name = f"sdpa-{backend_name}"

    def supports(self, cell: Cell) -> Optional[str]:
        if cell.kind != "fa":
            return "softmax only"
        if self.backend.name == "MATH" and cell.seqlen > 4096:
            return "math backend skipped above s = 4096 (materialises the score matrix)"
        return None

    def make(self, inputs: Inputs) -> Callable:
        from torch.nn.attention import sdpa_kernel

        causal = inputs.cell.causal

        def run(q, k, v):
            with sdpa_kernel([self.backend]):
                out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     is_causal=causal)  # fmt: skip
            return out.transpose(1, 2)

        return run


class FlashAttn(Impl):
    name = "flash_attn"

    def __init__(self, module):
        self.module = module

    def supports(self, cell: Cell) -> Optional[str]:
        return None if cell.kind == "fa" else "softmax only"

    def make(self, inputs: Inputs) -> Callable:
        causal = inputs.cell.causal
        return lambda q, k, v: self.module.flash_attn_func(q, k, v, causal=causal)


class TritonHstu(Impl):
    """generative-recommenders' triton_hstu_mha (jagged, SiLU / max_seq_len, causal, targets; no rab)."""

    name = "triton-hstu"
    isolate = True  # its backward has hit illegal memory accesses (TARGETS.md), which poison the process

    def __init__(self, fn):
        self.fn = fn
        self.params = set(inspect.signature(fn).parameters)

    def supports(self, cell: Cell) -> Optional[str]:
        if cell.kind != "hstu":
            return "HSTU only"
        if not cell.causal and "causal" not in self.params:
            return "causal only in this release"
        return "no relative attention bias in this kernel" if cell.rab else None

    def make(self, inputs: Inputs) -> Callable:
        cell = inputs.cell
        seqlen_name = "N" if "N" in self.params else "max_seq_len"  # the name changed across releases
        kw = {seqlen_name: cell.seqlen, "alpha": 1.0 / cell.d, "seq_offsets": inputs.cu_seqlens.to(torch.int64)}
        if inputs.num_targets is not None:
            kw["num_targets"] = inputs.num_targets.to(torch.int64)
        # Keywords that only some releases take.
        for name, value in (("causal", cell.causal), ("dropout_pr", 0.0), ("training", True)):
            if name in self.params:
                kw[name] = value
        return lambda q, k, v: self.fn(q=q, k=k, v=v, **kw)


def load_triton_hstu(folder: str):
    """Imports triton_hstu_mha from a generative-recommenders checkout (or any folder holding the package)."""
    sys.path.insert(0, folder)
    for module in ("generative_recommenders.ops.triton.triton_hstu_attention", "triton_hstu_attention"):
        try:
            return importlib.import_module(module).triton_hstu_mha
        except (ImportError, AttributeError):
            continue
    raise SystemExit(f"--triton-hstu {folder}: no triton_hstu_mha found (generative_recommenders/ops/triton/)")


def available(triton_hstu_folder: Optional[str], only: Optional[List[str]], backend: str = "auto") -> Dict[str, Impl]:
    impls: List[Impl] = [Cuteattn(backend)] + [Sdpa(b) for b in ("flash", "cudnn", "efficient", "math")]
    try:
        impls.append(FlashAttn(importlib.import_module("flash_attn")))
    except ImportError:
        pass
    if triton_hstu_folder:
        impls.append(TritonHstu(load_triton_hstu(triton_hstu_folder)))
    table = {i.name: i for i in impls}
    if only:
        unknown = [n for n in only if n not in table]
        if unknown:
            raise SystemExit(f"--peers: {', '.join(unknown)} not available (have: {', '.join(table)})")
        table = {n: table[n] for n in [OURS] + [n for n in only if n != OURS]}
    return table
