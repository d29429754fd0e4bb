#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install the Debian packages the suite needs (instead of skipping tests). Idempotent.
set -euo pipefail
PKGS=(bubblewrap chromium iproute2)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "[apt] installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
