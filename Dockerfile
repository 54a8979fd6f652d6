# Beacon in a container: `beacon serve` with embedded etcd, listening on
# every interface of the container.
#
#   docker build -t beacon .
#   docker run -p 2379:2379 -p 9379:9379 -v beacon-data:/var/lib/beacon beacon
#
# Two stages: the build (a static binary, CGO off, with the VCS revision
# that `beacon version` prints when the build context holds .git), then
# an image holding that binary, CA certificates (TLS to an external etcd)
# and nothing else, run as an unprivileged user.

FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/beacon ./cmd/beacon \
	&& /out/beacon version \
	&& mkdir -p /out/rootfs/etc /out/rootfs/var/lib/beacon \
	&& echo 'beacon:x:65532:65532:beacon:/var/lib/beacon:/sbin/nologin' > /out/rootfs/etc/passwd \
	&& echo 'beacon:x:65532:' > /out/rootfs/etc/group \
	&& chown -R 65532:65532 /out/rootfs/var/lib/beacon

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/rootfs/ /
COPY --from=build /out/beacon /usr/local/bin/beacon
USER 65532:65532
WORKDIR /var/lib/beacon
VOLUME /var/lib/beacon
# etcd clients, etcd peers, HTTP API/health/metrics, DNS (UDP and TCP).
EXPOSE 2379 2380 9379 9353/udp 9353/tcp
ENTRYPOINT ["/usr/local/bin/beacon"]
# A single node, reachable through the container's published ports. For a
# cluster, or to advertise the host's address, pass your own serve flags
# (they replace these): --advertise-client-urls, --initial-advertise-peer-urls,
# --initial-cluster or --discovery-token (see docs/operations.md).
CMD ["serve", "--data-dir", "/var/lib/beacon/data", \
	"--listen-client-urls", "http://0.0.0.0:2379", "--advertise-client-urls", "http://localhost:2379", \
	"--listen-peer-urls", "http://0.0.0.0:2380", "--initial-advertise-peer-urls", "http://localhost:2380", \
	"--http-addr", "0.0.0.0:9379", "--dns-addr", "0.0.0.0:9353"]
