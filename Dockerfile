# syntax=docker/dockerfile:1
#
# sendgate container image.
#
#   docker build -t sendgate:dev --build-arg SENDGATE_GIT_SHA=$(git rev-parse HEAD) .
#   docker run --rm -p 8080:8080 -e SENDGATE_AUTH=none sendgate:dev        # embedded queue, no keys
#
# Two stages: a Rust builder that compiles the release binary (dependencies in their own
# cached layer), and a distroless runtime holding only that binary, running as a non-root
# user. Azure deployment: infra/ (Bicep) runs this image on Container Apps.

# ---------------------------------------------------------------------------------------
# Builder. rust:1-bookworm carries gcc (rusqlite's `bundled` feature compiles SQLite from C)
# and matches the runtime's Debian 12 glibc. TLS is rustls, so no OpenSSL is needed.
FROM rust:1-bookworm AS builder
WORKDIR /build

# 1. Dependencies only. With just the manifests and stub targets, this layer is rebuilt
#    only when a Cargo.toml or Cargo.lock change, not on every source edit. (Building only
#    the `sendgate` bin does not need the [[test]] targets' files.) The workspace's
#    members (client/, wire/, entra/, backoff/: the server depends on them) get their
#    manifests and an empty lib.rs each; model/ and testkit/ (members the server's binary
#    does not use) their manifests and an empty lib.rs for good; bench/ is its own
#    workspace and is not needed.
COPY Cargo.toml Cargo.lock ./
COPY client/Cargo.toml ./client/
COPY wire/Cargo.toml ./wire/
COPY entra/Cargo.toml ./entra/
COPY backoff/Cargo.toml ./backoff/
COPY model/Cargo.toml ./model/
COPY testkit/Cargo.toml ./testkit/
RUN mkdir -p src client/src wire/src entra/src backoff/src model/src testkit/src \
    && printf 'fn main() {}\n' > src/main.rs \
    && : > src/lib.rs \
    && : > client/src/lib.rs \
    && : > wire/src/lib.rs \
    && : > entra/src/lib.rs \
    && : > backoff/src/lib.rs \
    && : > model/src/lib.rs \
    && : > testkit/src/lib.rs \
    && cargo build --release --locked --bin sendgate \
    && rm -rf src client/src wire/src entra/src backoff/src target/release/sendgate \
              target/release/deps/sendgate-* target/release/deps/libsendgate-* \
              target/release/deps/sendgate_* target/release/deps/libsendgate_* \
              target/release/.fingerprint/sendgate-*

# 2. The real sources. The stubs' fingerprints (sendgate, sendgate-client, sendgate-wire,
#    sendgate-entra, sendgate-backoff) were removed above, so cargo rebuilds the five crates whatever the
#    copied files' timestamps are.
COPY src ./src
COPY client/src ./client/src
COPY wire/src ./wire/src
COPY entra/src ./entra/src
COPY backoff/src ./backoff/src
# The commit, for /metrics' sendgate_build_info{git_sha} (compiled in; "unknown" unless
# given: docker build --build-arg SENDGATE_GIT_SHA=$(git rev-parse HEAD) .).
ARG SENDGATE_GIT_SHA=unknown
RUN cargo build --release --locked --bin sendgate \
    && install -D -m 0755 target/release/sendgate /out/sendgate

# ---------------------------------------------------------------------------------------
# Runtime: distroless "cc" (glibc, libgcc, CA certificates, tzdata; no shell, no package
# manager), tag `nonroot` = uid/gid 65532.
#
# No HEALTHCHECK: distroless has no shell or curl to run one, and the orchestrator does not
# use it anyway. Container Apps probes GET /health/live (liveness) and GET /health/ready
# (readiness) itself (infra/main.bicep); `docker run` users can curl the same routes.
#checkov:skip=CKV_DOCKER_2:distroless has no shell/curl for a HEALTHCHECK; Container Apps liveness/readiness probes on /health/live and /health/ready are defined in infra/main.bicep
FROM gcr.io/distroless/cc-debian12:nonroot

LABEL org.opencontainers.image.title="sendgate" \
      org.opencontainers.image.description="HTTP gateway in front of a message queue that refuses work the queue cannot take" \
      org.opencontainers.image.licenses="MIT"

COPY --from=builder /out/sendgate /usr/local/bin/sendgate

# Listen on all interfaces inside the container. A non-loopback listener needs API keys
# (SENDGATE_API_KEYS_FILE) or an explicit SENDGATE_AUTH=none, or sendgate exits 2.
# The embedded backend (SENDGATE_BACKEND=embedded, the default) creates its data directory
# in the runtime user's home, which that user owns; mount a volume there to keep its
# messages across container restarts. The Service Bus backend writes nothing to disk.
ENV SENDGATE_LISTEN=0.0.0.0:8080 \
    SENDGATE_DATA_DIR=/home/nonroot/sendgate-data

USER 65532:65532
WORKDIR /home/nonroot
EXPOSE 8080

# Exec form: sendgate is PID 1 and receives SIGTERM itself. It handles SIGTERM/SIGINT
# (drain: /health/ready turns 503, new sends get 503 draining, sends in flight finish, then
# exit 0 within SENDGATE_DRAIN_TIMEOUT_S), so no init process is needed; it spawns no
# children, so there are no zombies to reap.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/sendgate"]
CMD ["serve"]
