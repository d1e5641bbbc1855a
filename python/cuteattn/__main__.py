"""`python -m cuteattn [args]`: runs the cuteattn-cli program (the project's main job: the demo on the best
backend of this machine) with the given arguments. A wheel bundles it in cuteattn/bin; in a build tree
(PYTHONPATH=build/<name>/python:python) it is build/<name>/cuteattn-cli."""

import os
import sys
from pathlib import Path

from ._binding import _C


def _find_cli() -> Path:
    candidates = [Path(__file__).resolve().parent / "bin" / "cuteattn-cli",
                  Path(_C.__file__).resolve().parent.parent / "cuteattn-cli"]  # fmt: skip
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    sys.exit("cuteattn: cuteattn-cli was not built with this package (CMake option CUTEATTN_CLI=ON builds it); "
             "looked in: " + ", ".join(map(str, candidates)))  # fmt: skip


if __name__ == "__main__":
    cli = _find_cli()
    os.execv(cli, [str(cli), *sys.argv[1:]])
