"""Generates the Python modules of protos/*.proto, or checks they are current.

The generated modules are checked in so that installing the project needs no
protoc. Run this after editing a .proto file:

    python scripts/generate_protos.py          # rewrite protos/*_pb2*.py(i)
    python scripts/generate_protos.py --check  # exit 1 if they are stale

The output depends on the grpcio-tools version, which the `dev` extra pins.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _generate(out_root: Path) -> list[Path]:
    """Runs protoc for every .proto file, writing under out_root/protos/."""
    (out_root / "protos").mkdir(parents=True, exist_ok=True)
    protos = sorted(p.relative_to(ROOT).as_posix() for p in PROTO_DIR.glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the messages above")
    return sorted((out_root / "protos").iterdir())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the checked-in modules are stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generated = _generate(Path(tmp))
        checked_in = {p.name for p in PROTO_DIR.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}
        stale = [
            p.name
            for p in generated
            if not (PROTO_DIR / p.name).exists() or not filecmp.cmp(p, PROTO_DIR / p.name, shallow=False)
        ]
        stale += sorted(checked_in - {p.name for p in generated})
        if args.check:
            if stale:
                print(
                    f"stale generated modules: {', '.join(stale)}; run python scripts/generate_protos.py",
                    file=sys.stderr,
                )
                return 1
            print("generated modules are current")
            return 0
        for name in sorted(checked_in - {p.name for p in generated}):
            (PROTO_DIR / name).unlink()
        for p in generated:
            shutil.copyfile(p, PROTO_DIR / p.name)
        print(f"wrote {len(generated)} modules to protos/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
