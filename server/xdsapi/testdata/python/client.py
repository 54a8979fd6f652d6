"""A proxyless gRPC client in Python on gRPC C-core (Debian's python3-grpcio),
driven by the Go tests of server/xdsapi over stdin and stdout.

    python3 client.py TARGET...     (GRPC_XDS_BOOTSTRAP names the bootstrap)

Each line "call MS [I]" makes one grpc.health.v1.Health/Check call on the I-th
TARGET (0 when absent; one channel per target, all on this process's one xDS
client) with a deadline of MS milliseconds and prints one line: "ok BACKEND"
(the x-beacon-backend header of the server that answered) or "err CODE
DETAILS".
The request is the empty message and the response is not decoded, so no
generated stubs are needed. The client exits when stdin closes.
"""
import sys

import grpc


def main():
    channels = [grpc.insecure_channel(t) for t in sys.argv[1:]]
    checks = [c.unary_unary("/grpc.health.v1.Health/Check") for c in channels]
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] != "call":
            continue
        ms = int(parts[1]) if len(parts) > 1 else 5000
        check = checks[int(parts[2]) if len(parts) > 2 else 0]
        try:
            _, call = check.with_call(b"", timeout=ms / 1000.0)
            backend = dict(call.initial_metadata()).get("x-beacon-backend", "")
            print("ok " + backend, flush=True)
        except grpc.RpcError as e:
            details = (e.details() or "").replace("\n", " ")
            print("err " + e.code().name + " " + details, flush=True)
    for c in channels:
        c.close()


if __name__ == "__main__":
    main()
