#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build (or reuse) the NeMo Gym venv for the `nemo-polar[gym]` extra and print its path on the last line:
#   ~/.cache/nemo-polar/gym-venv-<hash>   (POLAR_CACHE_DIR overrides ~/.cache/nemo-polar)
#
# nemo-gym 0.7.0 declares Requires-Python >=3.13.14. On this project's Python 3.11 it installs with
# `--ignore-requires-python` plus the pins below (docs/nemo.md), which is what `make test` uses. On Python >= 3.13.14
# the normal path is `pip install "nemo-polar[gym]"` (no flag, no pins needed).
#
# The venv also gets what the polar_swe server process runs: torch (CPU; CALL-CREDIT's annotate imports it),
# transformers/tokenizers (the proxy's prefix-preserving splice) at the project's pinned versions, pytest for the
# Gym-side test runs, nemo-polar itself editable without dependencies, and `server-venvs/` (see the end). Idempotent: a finished venv is marked
# `.complete` and reused; the editable install is redone only when it points at another checkout.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${POLAR_CACHE_DIR:-$HOME/.cache/nemo-polar}"
PY="${POLAR_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

GYM_PINS=(
  "nemo-gym==0.7.0"
  "scipy<1.17"
  "numpy<2.4"
  "hydra-core>=1.3.2"
  "omegaconf>=2.3"
)
# Same versions as the project venv (constraints.txt), so tokenisation matches the tests' expectations.
pin() { grep -i -E "^$1==" constraints.txt | head -n1; }
EXTRA_PINS=("$(pin torch)" "$(pin transformers)" "$(pin tokenizers)" "$(pin pytest)" "$(pin pytest-timeout)")

HASH=$( (printf '%s\n' "${GYM_PINS[@]}" "${EXTRA_PINS[@]}"; "$PY" -c 'import sys; print(sys.version_info[:2])') \
  | sha256sum | cut -c1-16)
VENV="$CACHE/gym-venv-$HASH"

quiet() { "$@" 2>&1 | sed -e '/WARNING: Location .* is ignored/d' -e '/BuildBackendWarning/d'; return "${PIPESTATUS[0]}"; }

if [ ! -f "$VENV/.complete" ]; then
  echo "[gym-venv] building $VENV (cold: several minutes, ~2 GB)" >&2
  rm -rf "$VENV"
  mkdir -p "$CACHE/pip"
  "$PY" -m venv "$VENV"
  export PIP_CACHE_DIR="$CACHE/pip"
  quiet "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  # torch alone first, so the CPU wheel is the one taken
  quiet "$VENV/bin/python" -m pip install -q "$(pin torch)" >&2
  # nemo-gym itself past its Requires-Python; its dependencies resolved normally, so pip picks releases that
  # support this Python (with --ignore-requires-python for everything it would take e.g. contourpy 1.4 and fail)
  quiet "$VENV/bin/python" -m pip install -q --no-deps --ignore-requires-python "${GYM_PINS[0]}" >&2
  mapfile -t GYM_DEPS < <("$VENV/bin/python" -c \
    'import importlib.metadata as m; print("\n".join(r for r in m.requires("nemo-gym") if "extra ==" not in r))')
  quiet "$VENV/bin/python" -m pip install -q "${GYM_DEPS[@]}" "${GYM_PINS[@]:1}" "${EXTRA_PINS[@]}" >&2
  "$VENV/bin/python" -m pip check >&2 || true  # nemo-gym's Requires-Python is reported here, knowingly
  touch "$VENV/.complete"
else
  echo "[gym-venv] reusing $VENV" >&2
fi

# nemo-polar editable, no dependencies (its runtime deps come with nemo-gym and the pins above). Checked from /,
# where the checkout's own directory cannot shadow the installed package.
REPO=$(pwd)
if ! (cd / && "$VENV/bin/python" -c "import nemo_polar, sys, pathlib; \
    sys.exit(0 if pathlib.Path(nemo_polar.__file__).resolve().parent == pathlib.Path('$REPO/nemo_polar').resolve() else 1)") \
    2>/dev/null; then
  if ! "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e . >"$VENV/editable-install.log" 2>&1; then
    cat "$VENV/editable-install.log" >&2
    exit 1
  fi
fi
# Gym starts each server from <uv_venv_dir>/<type>/<name>/.venv. These links let `uv_venv_dir=$VENV/server-venvs`
# plus `skip_venv_if_present=true` run every server of our configs from this venv (no per-server uv install). They
# live here, not under /tmp: the bubblewrap sandbox has a private /tmp, and the gateway's relay runs the server's
# own interpreter inside it.
for rel in resources_servers/polar_swe responses_api_agents/polar_agent environment_servers/legacy_agent \
    responses_api_models/vllm_model; do
  mkdir -p "$VENV/server-venvs/$rel"
  ln -sfn "$VENV" "$VENV/server-venvs/$rel/.venv"
done
echo "$VENV"
