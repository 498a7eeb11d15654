"""The ``toolwitness.v1.ToolBoundary`` wire modules (generated from proto/toolwitness/v1/intercept.proto).

The generated gRPC module's stubs (``intercept_pb2_grpc.pyi``) need grpc type stubs, which
the project does not pin, so it is loaded untyped here; the messages stay fully typed.
"""

from __future__ import annotations

import importlib
from typing import Any

from collector.wire.gen import intercept_pb2
from collector.wire.gen.intercept_pb2 import InterceptToolRequest, InterceptToolResponse

__all__ = ["SERVICE", "InterceptToolRequest", "InterceptToolResponse", "boundary_grpc", "intercept_pb2"]

#: ``collector.wire.gen.intercept_pb2_grpc`` (ToolBoundaryStub, ToolBoundaryServicer, add_..._to_server).
boundary_grpc: Any = importlib.import_module("collector.wire.gen.intercept_pb2_grpc")
#: full gRPC service name
SERVICE = "toolwitness.v1.ToolBoundary"
