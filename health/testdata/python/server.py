"""A grpc.health.v1 server in Python on gRPC C-core (Debian's python3-grpcio),
driven by the Go tests of health/ over stdin and stdout.

    python3 server.py STUBS_DIR

STUBS_DIR holds health_pb2.py and health_pb2_grpc.py, generated from
health.proto by python3 -m grpc_tools.protoc (Debian's python3-grpc-tools).

It serves on a loopback port and prints "port N" first. The overall service
("") starts SERVING; no other service is known until set. Each stdin line
"set STATUS [SERVICE]" (STATUS a ServingStatus name, SERVICE absent for the
overall service) sets a status and is answered "set STATUS SERVICE" once
done. As in grpcio-health-checking's HealthServicer, Check answers NOT_FOUND
for an unknown service, Watch sends SERVICE_UNKNOWN for one, and every set
is pushed to the service's watchers, a repeated status too. Each Check and
each Watch call prints "check SERVICE" or "watch SERVICE" when it arrives.
The server exits when stdin closes.
"""
import sys
import threading
from concurrent import futures

import grpc

sys.path.insert(0, sys.argv[1])
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402

Response = health_pb2.HealthCheckResponse
out_lock = threading.Lock()


def say(line):
    with out_lock:
        print(line, flush=True)


class Health(health_pb2_grpc.HealthServicer):
    def __init__(self):
        self._cond = threading.Condition()
        self._status = {"": Response.SERVING}
        self._sets = {}  # service -> list of every status set, in order

    def set(self, service, status):
        with self._cond:
            self._status[service] = status
            self._sets.setdefault(service, []).append(status)
            self._cond.notify_all()

    def Check(self, request, context):
        say("check " + request.service)
        with self._cond:
            status = self._status.get(request.service)
        if status is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service " + request.service)
        return Response(status=status)

    def Watch(self, request, context):
        say("watch " + request.service)
        service = request.service
        context.add_callback(self._wake)
        with self._cond:
            status = self._status.get(service, Response.SERVICE_UNKNOWN)
            seen = len(self._sets.get(service, []))
        yield Response(status=status)
        while True:
            with self._cond:
                while context.is_active() and len(self._sets.get(service, [])) == seen:
                    self._cond.wait()
                if not context.is_active():
                    return
                pending = self._sets[service][seen:]
                seen += len(pending)
            for status in pending:
                yield Response(status=status)

    def _wake(self):
        with self._cond:
            self._cond.notify_all()


def main():
    health = Health()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    say("port %d" % port)
    for line in sys.stdin:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "set":
            service = parts[2] if len(parts) > 2 else ""
            health.set(service, Response.ServingStatus.Value(parts[1]))
            say("set %s %s" % (parts[1], service))
    server.stop(None)


if __name__ == "__main__":
    main()
