# SPDX-License-Identifier: Apache-2.0
"""Container images built here, without a registry: the base image and per-task images, cached by content hash.

Base image `polar-base:<hash>`: a Debian root filesystem made on the host by `mmdebstrap --variant=minbase` with
every package the tasks need (`BASE_PACKAGES`) from the Debian mirror apt already uses, then `import`ed into the
engine. The tarball is cached in `<cache>/images/rootfs/`; the hash covers the suite, variant, package list and
mirror, so a changed recipe is a new image and an unchanged one is never rebuilt.

Task image `polar-task-<name>:<hash>`: `FROM polar-base:<hash>` plus the task's repository tree copied to
`/testbed` (`WORKDIR /testbed`, as SWE-bench images), built with `--network none` (the build only copies files;
nothing inside it reaches the network). The hash covers the base tag and every file of the tree (path, mode,
content). Images are built on the engine that will run them (Docker and Podman keep separate stores).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from nemo_polar.runtime.engines import Engine, EngineError
from nemo_polar.runtime.sandbox import host_cache_root

__all__ = [
    "BASE_PACKAGES",
    "BuiltImage",
    "base_tag",
    "debian_mirror",
    "ensure_base",
    "ensure_task_image",
    "image_present",
    "task_tag",
    "tree_digest",
]

SUITE = "bookworm"
VARIANT = "minbase"
BASE_PACKAGES = ("python3", "python3-pytest", "git", "patch", "ca-certificates", "procps")
BASE_REPO = "polar-base"
_RECIPE_VERSION = "1"
_NAME_RE = re.compile(r"[^a-z0-9_.-]+")


@dataclass(frozen=True, slots=True)
class BuiltImage:
    tag: str
    built: bool  # False when it was already present (cache hit)
    seconds: float
    size_bytes: int


def debian_mirror() -> str:
    """The Debian mirror apt already uses (`POLAR_DEBIAN_MIRROR` overrides), from apt's own configuration."""
    override = os.environ.get("POLAR_DEBIAN_MIRROR")
    if override:
        return override
    try:
        out = subprocess.run(
            ["apt-get", "indextargets", "--format", "$(REPO_URI) $(RELEASE)"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        uri, _, release = line.partition(" ")
        if release.strip() == SUITE and "security" not in uri:
            return uri.rstrip("/")
    return "http://deb.debian.org/debian"


def base_tag(mirror: str | None = None) -> str:
    recipe = "\n".join([_RECIPE_VERSION, SUITE, VARIANT, ",".join(BASE_PACKAGES), mirror or debian_mirror()])
    return f"{BASE_REPO}:{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def image_present(engine: Engine, tag: str) -> bool:
    return engine.run_sync("image", "inspect", "--format", "{{.Id}}", tag, timeout_s=60).ok


def _size(engine: Engine, tag: str) -> int:
    res = engine.run_sync("image", "inspect", "--format", "{{.Size}}", tag, timeout_s=60)
    try:
        return int(res.stdout.strip())
    except ValueError:
        return 0


def _rootfs(tag: str, mirror: str) -> Path:
    """The base root filesystem tarball for `tag` (made with mmdebstrap once, then cached)."""
    out = host_cache_root() / "images" / "rootfs" / f"{tag.replace(':', '-')}.tar"
    if out.exists():
        return out
    exe = shutil.which("mmdebstrap")
    if exe is None:
        raise EngineError("mmdebstrap is not installed (apt-get install mmdebstrap, or `make deps`)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}.tar")
    argv = [exe, f"--variant={VARIANT}", "--include=" + ",".join(BASE_PACKAGES), "--format=tar", "--quiet"]
    argv += [SUITE, str(tmp), mirror]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise EngineError(f"mmdebstrap failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    tmp.replace(out)
    return out


def ensure_base(engine: Engine) -> BuiltImage:
    """The base image on `engine`, built (root filesystem + import) unless present."""
    mirror = debian_mirror()
    tag = base_tag(mirror)
    t0 = time.monotonic()
    if image_present(engine, tag):
        return BuiltImage(tag, False, time.monotonic() - t0, _size(engine, tag))
    tar = _rootfs(tag, mirror)
    changes = ['CMD ["/bin/bash"]', "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    changes += ["ENV LANG=C.UTF-8"]
    args = ["import"]
    for c in changes:
        args += ["--change", c]
    engine.check(engine.run_sync(*args, str(tar), tag, timeout_s=1800), f"import {tag}")
    return BuiltImage(tag, True, time.monotonic() - t0, _size(engine, tag))


def tree_digest(tree: Path) -> str:
    """A content hash of a directory tree: every file's relative path, executable bit and bytes; links by target."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(tree).as_posix()
            if path.is_symlink():
                h.update(f"L {rel} {os.readlink(path)}\n".encode())
                continue
            mode = "x" if os.access(path, os.X_OK) else "-"
            h.update(f"F {rel} {mode} {path.stat().st_size}\n".encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def task_tag(name: str, tree: Path, base: str) -> str:
    repo = "polar-task-" + _NAME_RE.sub("-", name.lower()).strip("-")
    digest = hashlib.sha256(f"{base}\n{tree_digest(tree)}".encode()).hexdigest()[:12]
    return f"{repo}:{digest}"


def ensure_task_image(engine: Engine, name: str, tree: Path, base: str | None = None) -> BuiltImage:
    """The task image for `tree` (the repository as it is at the task's base commit, `.git` included) on `engine`,
    built `FROM` the base image with `--network none` unless present."""
    base = base or ensure_base(engine).tag
    tag = task_tag(name, tree, base)
    t0 = time.monotonic()
    if image_present(engine, tag):
        return BuiltImage(tag, False, time.monotonic() - t0, _size(engine, tag))
    with tempfile.TemporaryDirectory(prefix="polar-build-") as ctx:
        shutil.copytree(tree, Path(ctx) / "testbed", symlinks=True)
        (Path(ctx) / "Dockerfile").write_text(f"FROM {base}\nCOPY testbed /testbed\nWORKDIR /testbed\n")
        args = ["build", "--network", "none", "-t", tag]
        if engine.kind == "podman":
            args += ["--pull=never"]
        env_engine = Engine(engine.kind, engine.cli, {**engine.env, "DOCKER_BUILDKIT": "0"})
        env_engine.check(env_engine.run_sync(*args, ctx, timeout_s=1800), f"build {tag}")
    return BuiltImage(tag, True, time.monotonic() - t0, _size(engine, tag))
