"""Loads the compiled module: `cuteattn._cuteattn` in an installed wheel, or a top-level `_cuteattn` from a build
tree on PYTHONPATH (scripts/build puts it in build/<name>/python). torch is imported first so that the CUDA
runtime it loads serves the library too."""

import torch  # noqa: F401  (load order, see above)

try:
    from . import _cuteattn as _C
except ImportError:
    try:
        import _cuteattn as _C
    except ImportError as e:
        raise ImportError(
            "cuteattn: the compiled module _cuteattn was not found; install the package (pip install .) or put "
            "a build's python folder on PYTHONPATH (scripts/build, then PYTHONPATH=build/<name>/python:python)"
        ) from e

__all__ = ["_C"]
