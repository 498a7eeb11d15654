"""Tool response poisoning: the splice engine, campaigns, and the ``ToolBoundary`` gRPC service."""
