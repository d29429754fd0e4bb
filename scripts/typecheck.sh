#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# mypy on the core, the mapped packages included. mypy cannot follow setuptools' editable import hook, so we
# lay out the import tree as the wheel has it (nemo_polar/{credit,harness_adapters} as links) and check that.
set -euo pipefail
cd "$(dirname "$0")/.."
TREE=build/mypy-tree
rm -rf "$TREE" && mkdir -p "$TREE/nemo_polar"
for entry in nemo_polar/*; do
  ln -s "$(pwd)/$entry" "$TREE/nemo_polar/$(basename "$entry")"
done
ln -s "$(pwd)/credit" "$TREE/nemo_polar/credit"
ln -s "$(pwd)/harness_adapters" "$TREE/nemo_polar/harness_adapters"
cd "$TREE"
exec ../../.venv/bin/python -m mypy --config-file ../../pyproject.toml --cache-dir ../../.mypy_cache -p nemo_polar "$@"
