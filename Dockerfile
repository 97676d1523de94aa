# Hayate broker image: a multi-stage build, a small Debian runtime, a non-root user, state in
# a volume, a health check on the admin listener. docs/operations.md, "Container".
#
#   docker build -t hayate .
#   docker run -p 4700:4700 -p 1883:1883 -p 61613:61613 -v hayate-data:/var/lib/hayate hayate
#   (the admin listener stays on the container's loopback unless the config exposes it)

# --- build ---------------------------------------------------------------------------
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The release profile of the workspace (thin LTO). Only the binary crate is built.
RUN cargo build --release --locked -p hayate \
 && install -Dm755 target/release/hayate /out/hayate

# --- run -----------------------------------------------------------------------------
FROM debian:bookworm-slim
# curl: the health check only. Not pinned: the image takes Debian's security updates when
# rebuilt.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 hayate \
 && useradd --system --uid 10001 --gid hayate --home-dir /var/lib/hayate --shell /usr/sbin/nologin hayate \
 && install -d -o hayate -g hayate -m 0750 /var/lib/hayate /etc/hayate
COPY --from=build /out/hayate /usr/local/bin/hayate
COPY packaging/hayate.toml /etc/hayate/hayate.toml
USER 10001:10001
WORKDIR /var/lib/hayate
VOLUME ["/var/lib/hayate"]
# native, MQTT, MQTT over WebSocket, STOMP, admin HTTP
EXPOSE 4700 1883 8083 61613 4780
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["curl", "-fsS", "http://127.0.0.1:4780/readyz"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/hayate"]
CMD ["broker", "--config", "/etc/hayate/hayate.toml"]
