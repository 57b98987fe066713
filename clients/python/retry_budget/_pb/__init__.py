"""Generated protobuf and gRPC stubs of retrybudget.v1 (see gen_stubs.py)."""
