"""The xDS example's Python client: gRPC C-core resolves xds:///grpc.greeter.demo
through Beacon (no Beacon library) and calls the greeter example's SayHello in
a loop. The bootstrap file named by GRPC_XDS_BOOTSTRAP points it at Beacon
(beacon xds bootstrap writes one); see docs/xds.md.

    beacon serve &
    go run ./examples/greeter/server --addr 127.0.0.1:50051 --name one &
    beacon xds bootstrap > xds-bootstrap.json
    GRPC_XDS_BOOTSTRAP=$PWD/xds-bootstrap.json python3 examples/xds/python/client.py

It needs only the grpc package (Debian: apt-get install python3-grpcio): the
greeter speaks JSON, so no generated stubs are needed.
"""
import argparse
import json
import time

import grpc


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="xds:///grpc.greeter.demo")
    parser.add_argument("--count", type=int, default=0, help="stop after this many calls (0: until Ctrl-C)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between calls")
    args = parser.parse_args()
    with grpc.insecure_channel(args.target) as channel:
        say_hello = channel.unary_unary(
            "/greeter.Greeter/SayHello",
            request_serializer=lambda m: json.dumps(m).encode(),
            response_deserializer=json.loads,
        )
        i = 0
        while args.count == 0 or i < args.count:
            i += 1
            try:
                reply = say_hello({"name": "xds-python"}, timeout=10, wait_for_ready=True)
                print("reply from %s: %s" % (reply["server"], reply["message"]), flush=True)
            except grpc.RpcError as e:
                print("error: %s %s" % (e.code().name, e.details()), flush=True)
            time.sleep(args.interval)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
