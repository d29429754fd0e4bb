#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build (or reuse) the project venv under ~/.cache/nemo-polar/venvs/<hash of constraints.txt>,
# link .venv to it and install the project editable on top (no deps: the pins come from constraints.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${POLAR_CACHE_DIR:-$HOME/.cache/nemo-polar}"
PY="${POLAR_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
HASH=$( (cat constraints.txt; "$PY" -c 'import sys; print(sys.version_info[:2])') | sha256sum | cut -c1-16)
VENV="$CACHE/venvs/$HASH"

if [ ! -f "$VENV/.complete" ]; then
  echo "[setup] building venv $VENV (cold: a few minutes)"
  rm -rf "$VENV"
  mkdir -p "$CACHE/venvs" "$CACHE/pip"
  "$PY" -m venv "$VENV"
  export PIP_CACHE_DIR="$CACHE/pip"
  # this machine's pip config names optional local indexes; their "ignored" warnings are noise
  quiet() { "$@" 2>&1 | sed -e '/WARNING: Location .* is ignored/d'; }
  quiet "$VENV/bin/python" -m pip install -q --upgrade pip
  # torch first, alone, so the CPU wheel on this machine's disk is the one taken.
  quiet "$VENV/bin/python" -m pip install -q -c constraints.txt torch==2.13.0
  # Everything the project and the suite need (the test and ray extras), pinned by the constraints file.
  quiet "$VENV/bin/python" -m pip install -q -c constraints.txt setuptools wheel \
    $("$PY" - <<'PYEOF'
import tomllib
d = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = d["optional-dependencies"]
deps = list(d["dependencies"]) + list(extras["test"]) + list(extras["ray"])  # ray: `polar launch --ray`
print(" ".join(x.replace(" ", "") for x in deps))
PYEOF
)
  touch "$VENV/.complete"
else
  echo "[setup] reusing venv $VENV"
fi

ln -sfn "$VENV" .venv
# Editable install of the project itself (fast: no dependency resolution). The venv is shared by every checkout
# with the same constraints, so re-point it when its editable install belongs to another checkout. Checked from
# outside the repo: inside it, `nemo_polar` would import from the working directory whatever the install says.
# Also redone when one of the optional C extensions (setup.py: each nemo_polar/**/NAME.c builds module NAME in place,
# next to its source) is missing or older than its source and a compiler could build it; without a compiler the
# install would only skip them again, so it is not.
HERE="$(pwd)"
if ! (cd / && "$HERE/.venv/bin/python" - "$HERE" <<'PYEOF'
import shutil
import sys
import sysconfig
from pathlib import Path

root = Path(sys.argv[1]).resolve()
import nemo_polar, nemo_polar.credit, nemo_polar.harness_adapters  # noqa: E401

want = {nemo_polar: root / "nemo_polar", nemo_polar.credit: root / "credit",
        nemo_polar.harness_adapters: root / "harness_adapters"}
if not all(Path(m.__file__).resolve().parent == d for m, d in want.items()):
    sys.exit(1)

def stale(src):
    built = src.with_name(src.stem + sysconfig.get_config_var("EXT_SUFFIX"))
    return not built.exists() or built.stat().st_mtime < src.stat().st_mtime

cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
buildable = shutil.which(cc) and Path(sysconfig.get_paths()["include"], "Python.h").exists()
sys.exit(1 if buildable and any(stale(src) for src in (root / "nemo_polar").rglob("*.c")) else 0)
PYEOF
) 2>/dev/null; then
  log="$(mktemp)"  # setuptools' build warnings are noise unless the install fails
  if ! .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . >"$log" 2>&1; then
    cat "$log"; rm -f "$log"; exit 1
  fi
  rm -f "$log"
  echo "[setup] installed this checkout editable"
fi
echo "[setup] venv ready: .venv -> $VENV"
