"""Regenerate the gRPC stubs from ``sluice.proto``, ``namesrv.proto``, ``coordinator.proto`` and ``ha.proto``:
``python -m broker.proto.build`` (what ``make proto`` runs).

The proto is compiled with the repository root as include path so the generated service module imports
``broker.proto.sluice_pb2`` absolutely. ``.pyi`` type stubs come from mypy-protobuf's plugins when installed.
"""

from __future__ import annotations

import logging
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from grpc_tools import protoc

from broker.errors import BrokerError

log = logging.getLogger(__name__)

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent.parent
PROTO_NAMES = ("sluice", "namesrv", "coordinator", "ha")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi", "_pb2_grpc.pyi")


def _plugin(name: str) -> str | None:
    """Path of a protoc plugin script next to this interpreter (the venv's bin), if installed."""
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        candidate = folder / name
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    return found


def generate(out_dir: Path) -> list[Path]:
    """Compile the proto into ``out_dir/broker/proto/`` and return the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).resolve().parent / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{REPO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
    ]
    mypy_plugin, mypy_grpc_plugin = _plugin("protoc-gen-mypy"), _plugin("protoc-gen-mypy_grpc")
    if mypy_plugin and mypy_grpc_plugin:
        args += [f"--plugin=protoc-gen-mypy={mypy_plugin}", f"--mypy_out={out_dir}"]
        args += [f"--plugin=protoc-gen-mypy_grpc={mypy_grpc_plugin}", f"--mypy_grpc_out={out_dir}"]
    else:
        log.warning("mypy-protobuf is not installed: no .pyi stubs generated (pip install mypy-protobuf)")
    target = out_dir / "broker" / "proto"
    written: list[Path] = []
    for name in PROTO_NAMES:
        rel = f"broker/proto/{name}.proto"
        rc = protoc.main([*args, str(REPO_ROOT / rel)])
        if rc != 0:
            raise BrokerError(f"protoc failed with exit code {rc} compiling {rel}; see the messages above")
        grpc_stub = target / f"{name}_pb2_grpc.pyi"
        if grpc_stub.exists():
            # mypy-protobuf's service stubs carry ignores and overloads that strict mypy flags; they are generated.
            grpc_stub.write_text("# mypy: ignore-errors\n" + grpc_stub.read_text())
        written += [p for p in (target / f"{name}{suffix}" for suffix in GENERATED_SUFFIXES) if p.exists()]
    return written


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            shutil.copyfile(path, PROTO_DIR / path.name)
            log.info("wrote %s", PROTO_DIR / path.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
