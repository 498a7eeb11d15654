"""Generate the Python wire modules from proto/ — the one pinned generation step.

Output goes to collector/wire/gen/ (checked in, excluded from lint). The
generator is grpcio-tools at the version pinned in pyproject.toml, with
mypy-protobuf for .pyi stubs. Generated imports of the form
``from toolwitness.v1 import x_pb2`` are rewritten to the package path, so the
modules import without touching sys.path.

Usage: python scripts/gen_proto.py [--check]
  --check  regenerate into a temporary folder and exit 1 if it differs from
           what is checked in (the staleness test calls this).
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT = ROOT / "collector" / "wire" / "gen"
PACKAGE = "collector.wire.gen"
_IMPORT = re.compile(r"^from toolwitness\.v1 import (\w+) as (\w+)$", re.M)
_IMPORT_PLAIN = re.compile(r"^import toolwitness\.v1\.(\w+)$", re.M)
_STUB_REF = re.compile(r"\btoolwitness\.v1\.(\w+_pb2)\b")


def _generate(out: Path) -> None:
    import grpc_tools  # local import: only the generator needs it

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    bindir = Path(sys.executable).parent
    raw = out / "_raw"
    raw.mkdir(parents=True)
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc",
        f"-I{PROTO_ROOT}", f"-I{include}",
        f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={raw}", f"--mypy_out={raw}",
        f"--grpc_python_out={raw}", f"--mypy_grpc_out={raw}",
        *protos,
    ]
    subprocess.run(cmd, check=True, cwd=ROOT)
    src = raw / "toolwitness" / "v1"
    for f in sorted(src.iterdir()):
        text = f.read_text()
        text = _IMPORT.sub(rf"from {PACKAGE} import \1 as \2", text)
        text = _IMPORT_PLAIN.sub(rf"import {PACKAGE}.\1", text)
        text = _STUB_REF.sub(rf"{PACKAGE}.\1", text)
        # grpc stubs for protos without services are empty boilerplate: drop them.
        if f.name.endswith("_pb2_grpc.py") and "Stub" not in text:
            continue
        if f.name.endswith("_pb2_grpc.pyi") and "Stub" not in text:
            continue
        (out / f.name).write_text(text)
    shutil.rmtree(raw)
    header = '"""Generated from proto/toolwitness/v1 by scripts/gen_proto.py. Do not edit."""\n'
    (out / "__init__.py").write_text(header)
    (out / "py.typed").write_text("")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if checked-in code is stale")
    args = parser.parse_args()
    if not args.check:
        if OUT.exists():
            shutil.rmtree(OUT)
        OUT.mkdir(parents=True)
        _generate(OUT)
        print(f"generated {len(list(OUT.glob('*.py')))} modules in {OUT.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "gen"
        fresh.mkdir()
        _generate(fresh)
        cmp = filecmp.dircmp(fresh, OUT)
        stale = cmp.left_only + cmp.right_only + cmp.diff_files
        if stale:
            print(f"stale generated code in {OUT.relative_to(ROOT)}: {sorted(stale)}; run `make proto`")
            return 1
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
