# SPDX-License-Identifier: Apache-2.0
"""The benchmarks' temporary work directories: removed when the run ends, kept when it fails.

What a benchmark starts writes there (the proxy's record store, 100 MB to 1 GB a run; a peer's `log.txt`); left
behind, repeated `make bench` runs fill the disk. A directory is removed once the processes using it have stopped,
unless an exception is propagating (its logs and store are what someone debugging needs: it is kept and its path
printed to stderr) or `POLAR_KEEP_BENCH_DIRS=1` is set (every directory kept, each path printed).

    with work_dir("polar-x-") as work:  # a run
        ...
    release(self.tmp, exc)  # a class's __exit__, after its processes have stopped
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

KEEP_ENV = "POLAR_KEEP_BENCH_DIRS"


def failed(exc: BaseException | None) -> bool:
    """Whether `exc` (the exception propagating, if any) means the run failed: any but a clean `sys.exit(0)`."""
    if exc is None:
        return False
    if isinstance(exc, SystemExit):
        return exc.code not in (None, 0)
    return True


def release(path: str | Path | None, exc: BaseException | None = None) -> None:
    """Remove `path`, or keep it and say where: when `exc` is a failure, or `POLAR_KEEP_BENCH_DIRS` is set (not "0").

    For a class that owns a work directory: call it in `__exit__` (with the exception given there) after stopping
    the processes that write into it. No `path` (nothing was created): nothing to do."""
    if not path:
        return
    if failed(exc):
        why = f"the run failed: {type(exc).__name__}"
    elif os.environ.get(KEEP_ENV, "") not in ("", "0"):
        why = f"{KEEP_ENV} is set"
    else:
        shutil.rmtree(path, ignore_errors=True)
        return
    print(f"benchmark work directory kept ({why}): {path}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def work_dir(prefix: str) -> Iterator[Path]:
    """A new temporary directory for the block, released (`release`) when the block ends: removed, or kept when
    the block raises or `POLAR_KEEP_BENCH_DIRS` is set. Stop what writes into it inside the block."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    except BaseException as exc:
        release(path, exc)
        raise
    release(path)
