#!/usr/bin/env python3
"""Writes the request bodies of the h2load checks, in gRPC framing, into DIR:
health.bin, retry-delay.bin and pure-next-action.bin (the same requests as
the load generator's scenarios). Used by run.sh and ab-h2load.sh.

Usage: benches/grpc_bodies.py DIR
"""
import struct, sys

def varint(n):
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out

def field(number, value):
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value

frame = lambda m: b"\x00" + struct.pack(">I", len(m)) + m
bodies = {
    # HealthCheckRequest{}
    "health": b"",
    # RetryDelayRequest{activity_id: "flight-1", attempt: 4}
    "retry-delay": field(1, b"flight-1") + field(2, 4),
    # NextActionRequest{budget: {1, 3, 5, 30}, activity_id: "flight-1",
    # error_class: ERROR_CLASS_TRANSIENT}, as the loadgen's pure scenario
    "pure-next-action": field(1, field(1, 1) + field(2, 3) + field(3, 5) + field(4, 30))
    + field(2, b"flight-1") + field(3, 1),
}
for name, message in bodies.items():
    open(f"{sys.argv[1]}/{name}.bin", "wb").write(frame(message))
