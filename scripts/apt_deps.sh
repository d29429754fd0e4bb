#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install the Debian packages the suite needs (instead of skipping tests). Idempotent: when everything is already
# installed it only runs `dpkg -s` (well under a second) and touches nothing.
#   bubblewrap, iproute2: the local sandbox; chromium: the viewer test;
#   docker.io, podman, runc, uidmap, tini: the container runtimes (tini-static is each container's pid 1) (no daemon is started here: the suite and
#   `polar image` start dockerd themselves under the cache dir, and configure Podman with their own containers.conf);
#   mmdebstrap: the base image's root filesystem, made on the host from the Debian mirror apt already uses.
set -euo pipefail
PKGS=(bubblewrap chromium iproute2 docker.io podman runc uidmap tini mmdebstrap)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "[apt] installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
