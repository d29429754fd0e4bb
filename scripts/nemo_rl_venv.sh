#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build (or reuse) the NeMo RL environment and print its path on the last line:
#   ~/.cache/nemo-polar/nemo-rl-venv-<hash>   (POLAR_CACHE_DIR overrides ~/.cache/nemo-polar)
#
# What it holds: the real NeMo RL (NVIDIA-NeMo/RL @ 7ea279abf) and the NeMo Gym it pins (0.5.1 @ c3bac963), both
# from the vendored source archives in ../shared/vendor (POLAR_VENDOR_DIR overrides; sha256 checked before use),
# unpacked under the venv and installed editable with `--no-deps --ignore-requires-python` (their metadata asks for
# Python >= 3.13.14 and a CUDA stack); the dependencies their imported modules need, pinned in
# scripts/nemo_rl_pins.txt (found by trying; torch is the CPU wheel, installed alone first so pip never resolves a
# CUDA build); nemo-polar itself editable without dependencies. The tests under tests/nemo_rl/ run in this
# environment (tests/nemo_rl/test_in_nemo_rl_env.py starts them from the project venv's pytest).
#
# One adaptation, outside NeMo RL's files: its pydantic models use `typing.TypedDict`, which pydantic refuses on
# Python < 3.12 ("Please use typing_extensions.TypedDict"). A start-up hook in this venv only
# (site-packages/_polar_py311_typeddict.pth) makes `typing.TypedDict` the `typing_extensions` one on Python < 3.12,
# before anything imports. No NeMo RL or Gym source file is changed; on Python >= 3.12 the hook does nothing.
#
# POLAR_NEMO_RL_NO_BUILD=1: only find a finished venv (exit 3 when there is none; `polar train --smoke` asks so).
# Idempotent: a finished venv is marked `.complete` and reused; the editable nemo-polar install is redone only when
# it points at another checkout.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${POLAR_CACHE_DIR:-$HOME/.cache/nemo-polar}"
PY="${POLAR_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENDOR="${POLAR_VENDOR_DIR:-../shared/vendor}"

NEMO_RL_ARCHIVE="nemo-rl-7ea279abf.tar.gz"
NEMO_RL_SHA256="5ee8c196ba9a19e4fd24430d6b78dfa12ec5f1226c851c28972e9299e1b62b6c"
GYM_ARCHIVE="nemo-gym-c3bac963.tar.gz"
GYM_SHA256="7e083bb8154b9a90611b6649de787d714a7924ecf84798b9603a4f6056da7a46"
TORCH_PIN="$(grep -i -E '^torch==' constraints.txt | head -n1)"
PINS=scripts/nemo_rl_pins.txt

TYPEDDICT_HOOK='import sys
if sys.version_info < (3, 12):
    import typing

    import typing_extensions

    typing.TypedDict = typing_extensions.TypedDict'

for archive in "$NEMO_RL_ARCHIVE" "$GYM_ARCHIVE"; do
  if [ ! -f "$VENDOR/$archive" ]; then
    echo "[nemo-rl-venv] $VENDOR/$archive is missing (the vendored NeMo RL / NeMo Gym sources; see POLAR_VENDOR_DIR)" >&2
    exit 1
  fi
done
check() {
  local got
  got=$(sha256sum "$VENDOR/$1" | cut -d' ' -f1)
  if [ "$got" != "$2" ]; then
    echo "[nemo-rl-venv] $VENDOR/$1: sha256 $got, expected $2; refusing to install it" >&2
    exit 1
  fi
}
check "$NEMO_RL_ARCHIVE" "$NEMO_RL_SHA256"
check "$GYM_ARCHIVE" "$GYM_SHA256"

HASH=$( (cat "$PINS"; echo "$TORCH_PIN $NEMO_RL_SHA256 $GYM_SHA256"; echo "$TYPEDDICT_HOOK"
  "$PY" -c 'import sys; print(sys.version_info[:2])') | sha256sum | cut -c1-16)
VENV="$CACHE/nemo-rl-venv-$HASH"

quiet() {
  "$@" 2>&1 | sed -e '/WARNING: Location .* is ignored/d' -e '/BuildBackendWarning/d' -e '/^nemo-\(rl\|gym\) .* requires /d'
  return "${PIPESTATUS[0]}"
}

if [ ! -f "$VENV/.complete" ] && [ -n "${POLAR_NEMO_RL_NO_BUILD:-}" ]; then
  echo "[nemo-rl-venv] $VENV is not built (POLAR_NEMO_RL_NO_BUILD is set: not building it; run make nemo-rl)" >&2
  exit 3
fi
if [ ! -f "$VENV/.complete" ]; then
  echo "[nemo-rl-venv] building $VENV (cold: several minutes, ~2.5 GB)" >&2
  rm -rf "$VENV"
  mkdir -p "$CACHE/pip" "$VENV"
  "$PY" -m venv "$VENV"
  export PIP_CACHE_DIR="$CACHE/pip"
  quiet "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  quiet "$VENV/bin/python" -m pip install -q "$TORCH_PIN" >&2
  quiet "$VENV/bin/python" -m pip install -q -r "$PINS" "$TORCH_PIN" setuptools==84.2.1 wheel==0.47.0 >&2
  mkdir -p "$VENV/src"
  tar -xzf "$VENDOR/$NEMO_RL_ARCHIVE" -C "$VENV/src"
  tar -xzf "$VENDOR/$GYM_ARCHIVE" -C "$VENV/src"
  # Gym's setuptools config writes its egg-info into ./cache (egg_base), which the archive does not carry
  mkdir -p "$VENV/src/nemo-gym-c3bac963/cache"
  for src in nemo-rl-7ea279abf nemo-gym-c3bac963; do
    quiet "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation --ignore-requires-python \
      -e "$VENV/src/$src" >&2
  done
  SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  printf '%s\n' "$TYPEDDICT_HOOK" >"$SITE/_polar_py311_typeddict.py"
  echo "import _polar_py311_typeddict" >"$SITE/_polar_py311_typeddict.pth"
  # the modules the tests and the smoke run use, imported once so a broken environment fails here, not later
  (cd / && "$VENV/bin/python" -W ignore -c 'import nemo_rl.algorithms.grpo, nemo_rl.algorithms.loss.loss_functions, \
nemo_rl.environments.nemo_gym, nemo_rl.experience.rollouts, nemo_rl.data.datasets, nemo_rl.utils.config, nemo_gym.cli') >&2
  touch "$VENV/.complete"
else
  echo "[nemo-rl-venv] reusing $VENV" >&2
fi

# nemo-polar editable, no dependencies (checked from /, where the checkout cannot shadow the installed package)
REPO=$(pwd)
if ! (cd / && "$VENV/bin/python" -c "import nemo_polar, sys, pathlib; \
    sys.exit(0 if pathlib.Path(nemo_polar.__file__).resolve().parent == pathlib.Path('$REPO/nemo_polar').resolve() else 1)") \
    2>/dev/null; then
  if ! "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e . >"$VENV/editable-install.log" 2>&1; then
    cat "$VENV/editable-install.log" >&2
    exit 1
  fi
fi
echo "$VENV"
