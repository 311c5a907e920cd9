"""The Khronos glTF validator (npm ``gltf-validator``, pinned in tests/gltf_validator/),
run with node on a GLB: its report, or ``Unavailable`` saying what is missing."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent / "gltf_validator"


class Unavailable(RuntimeError):
    """node, npm or the validator package is missing here; the message says which."""


def _installed() -> bool:
    return (HERE / "node_modules" / "gltf-validator" / "package.json").is_file()


def ensure() -> str:
    """The node executable, after installing the pinned validator when it is missing."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        raise Unavailable("node is not on PATH (apt-get install nodejs npm)")
    if not _installed():
        if npm is None:
            raise Unavailable(f"npm is not on PATH to install the validator (apt-get install npm; npm ci --prefix {HERE})")
        proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=HERE, capture_output=True,
                              text=True, timeout=300)
        if proc.returncode != 0 or not _installed():
            raise Unavailable(f"npm ci in {HERE} failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-500:]}")
    return node


def validate(path) -> dict:
    """The validator's report of ``path`` (``report["issues"]["numErrors"]`` and so on)."""
    node = ensure()
    proc = subprocess.run([node, str(HERE / "validate.js"), str(path)], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"the validator could not run on {path}: {proc.stderr[-500:]}")
    return json.loads(proc.stdout)


def errors(report: dict) -> list[str]:
    """The report's errors (severity 0), as 'CODE at POINTER: message'."""
    return [f"{m['code']} at {m.get('pointer', '?')}: {m['message']}"
            for m in report["issues"]["messages"] if m["severity"] == 0]
