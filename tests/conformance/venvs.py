"""The virtualenvs conformance agents run in: ``python -m tests.conformance.venvs [name ...]`` builds them.

Frameworks whose pins agree with ours are in the project's own ``.venv`` (the ``conformance``
extra). The others get one each under ``.cache/venvs/<name>``, built from
``tests/conformance/requirements/<name>.txt`` and rebuilt when that file changes.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = Path(__file__).resolve().parent / "requirements"
VENVS = ROOT / ".cache" / "venvs"
#: the venv of the test process itself
MAIN = "main"


def names() -> list[str]:
    return sorted(p.stem for p in REQUIREMENTS.glob("*.txt"))


def python(name: str) -> Path:
    """The interpreter of venv ``name``, built first if missing or stale."""
    if name == MAIN:
        return Path(sys.executable)
    req = REQUIREMENTS / f"{name}.txt"
    if not req.is_file():
        raise ValueError(f"no requirements file for conformance venv {name!r} ({req})")
    digest = hashlib.sha256(req.read_bytes()).hexdigest()
    venv = VENVS / name
    stamp = venv / ".requirements-sha256"
    exe = venv / "bin" / "python"
    VENVS.mkdir(parents=True, exist_ok=True)
    with open(VENVS / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test processes must not build one venv at once
        if exe.exists() and stamp.exists() and stamp.read_text() == digest:
            return exe
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(exe), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, "-r", str(req)], check=True)
        stamp.write_text(digest)
    return exe


if __name__ == "__main__":
    for n in sys.argv[1:] or names():
        print(f"{n}: {python(n)}")
