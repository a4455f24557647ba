"""The checked-in gRPC stubs must be what `make proto` generates from tidemq.proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_stubs_are_current(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'client'}", f"--python_out={tmp_path}",
         f"--grpc_python_out={tmp_path}", str(ROOT / "client/tidemq/rpc/tidemq.proto")],
        check=True,
    )
    for name in ("tidemq_pb2.py", "tidemq_pb2_grpc.py"):
        fresh = (tmp_path / "tidemq/rpc" / name).read_text()
        checked_in = (ROOT / "client/tidemq/rpc" / name).read_text()
        assert fresh == checked_in, f"client/tidemq/rpc/{name} is stale: run `make proto`"
