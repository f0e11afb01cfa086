"""What the benches install with npm, once, into a cache of their own (never the repo tree):
the seeds' server for ``--http`` and the seeds' sender for ``--delivery``."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

NPM_TIMEOUT = 300.0


def cache_root() -> Path:
    """Where the bench keeps what it installs: $GOV_DATA_DIR, else ~/.cache/gov (never the repo tree)."""
    configured = os.environ.get("GOV_DATA_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "gov"


def node_modules(package_dir: Path, cache_name: str, what: str,
                 progress: Callable[[str], None]) -> tuple[Path | None, str]:
    """The node_modules of ``package_dir/package.json``, installed once per package.json under
    the cache's ``cache_name``; (None, why) when they cannot be.

    The directory is named by a digest of package.json, so a changed dependency is installed
    afresh; it is installed in a temporary directory and renamed into place, so an install
    that failed or was interrupted never looks complete, and two benches at once do not clash.
    """
    if shutil.which("node") is None:
        return None, "node is not on PATH"
    npm = shutil.which("npm")
    if npm is None:
        return None, "npm is not on PATH (node is)"
    manifest = (package_dir / "package.json").read_bytes()
    home = cache_root() / cache_name
    target = home / hashlib.sha256(manifest).hexdigest()[:16]
    if (target / "node_modules").is_dir():
        return target / "node_modules", f"node_modules in {target}"
    progress(f"installing {what} (npm install in {target})")
    try:
        home.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".install-", dir=home))
    except OSError as exc:
        return None, f"cannot create {home}: {exc.strerror}"
    try:
        (staging / "package.json").write_bytes(manifest)
        try:
            done = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=staging,
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=NPM_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            return None, f"npm install did not finish in {NPM_TIMEOUT:g} s"
        if done.returncode != 0 or not (staging / "node_modules").is_dir():
            return None, f"npm install failed: {_npm_reason(done.stderr + done.stdout, done.returncode)}"
        try:
            staging.rename(target)
        except OSError:
            if not (target / "node_modules").is_dir():  # not another bench's install winning the race
                raise
        return target / "node_modules", f"installed in {target}"
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _npm_reason(output: str, returncode: int) -> str:
    """npm's error code and first sentence, from the dozen lines it prints (a stack, a log path)."""
    code = re.search(r"^npm (?:error|ERR!) code (\S+)", output, re.MULTILINE)
    said = re.search(r"^npm (?:error|ERR!) (?!code |syscall |errno |\s)(.{20,})$", output, re.MULTILINE)
    return f"{code.group(1) if code else f'exit {returncode}'}: {said.group(1)[:200] if said else 'no message'}"
