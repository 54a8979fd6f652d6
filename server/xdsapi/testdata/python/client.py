"""A proxyless gRPC client in Python on gRPC C-core (Debian's python3-grpcio),
driven by the Go tests of server/xdsapi over stdin and stdout.

    python3 client.py TARGET        (GRPC_XDS_BOOTSTRAP names the bootstrap)

Each line "call MS" makes one grpc.health.v1.Health/Check call on TARGET with
a deadline of MS milliseconds and prints one line: "ok BACKEND" (the
x-beacon-backend header of the server that answered) or "err CODE DETAILS".
The request is the empty message and the response is not decoded, so no
generated stubs are needed. The client exits when stdin closes.
"""
import sys

import grpc


def main():
    target = sys.argv[1]
    with grpc.insecure_channel(target) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        for line in sys.stdin:
            parts = line.split()
            if not parts or parts[0] != "call":
                continue
            ms = int(parts[1]) if len(parts) > 1 else 5000
            try:
                _, call = check.with_call(b"", timeout=ms / 1000.0)
                backend = dict(call.initial_metadata()).get("x-beacon-backend", "")
                print("ok " + backend, flush=True)
            except grpc.RpcError as e:
                details = (e.details() or "").replace("\n", " ")
                print("err " + e.code().name + " " + details, flush=True)


if __name__ == "__main__":
    main()
