# MissionWeave mesh image: one binary (`mwp`), every service selected by `mwp serve --service NAME`.
#
# The canonical image is the one `make image` builds (docs/image.md): Debian bookworm's packages and the
# same wheels (`pip wheel ./client .`, the console built in), no registry needed, checked by
# `make image-check` and CI. This Dockerfile is for operators with access to Docker Hub; keep its runtime
# stage to the same contract (uid/gid 10001, /var/lib/missionweave, the MWP_* env below, entrypoint
# `mwp`, cmd `serve`), which tools/image/build.sh and tools/image/check.sh spell out too.
#
#   docker build -t missionweave:0.1.0 .
#   docker run --rm -p 50051:50051 -p 50080:50080 -v "$PWD/tls:/tls:ro" -e MWP_TLS_CA=/tls/ca.crt \
#       missionweave:0.1.0 serve --listen 0.0.0.0:50051 --tls-cert /tls/server.crt --tls-key /tls/server.key
#
# Plain text on 0.0.0.0 is refused unless `--insecure` (MWP_INSECURE=1) says so; `serve --tls-auto` makes
# a throw-away CA and certificate in the data dir instead (docs/tls.md).
#
# Where the gateway runs, the image serves the web console (docs/console.md) on 0.0.0.0:50080, over TLS
# when the mesh speaks TLS (it then dials the mesh with MWP_TLS_CA), answering the Host names in
# MWP_CONSOLE_HOSTS: localhost:50080 and 127.0.0.1:50080 unless set (k8s/gateway.yaml sets its own).
#
# The protobuf modules are generated from protos/ by the client's build (client/setup.py's build_py), so the
# image never depends on generated files in the build context; the console is built from console/ and
# protos/ in a Node.js stage (as `make console` builds it), never taken from the build context.

# ---------------------------------------------------------------- build the web console
FROM node:20-bookworm-slim AS console
WORKDIR /src/console
# npm ci first, from the lock file alone: the layer is reused until a dependency changes.
COPY console/package.json console/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY console/ ./
COPY protos/ /src/protos/
# TypeScript types from protos/ (buf, protoc-gen-es), a strict type check, then the esbuild bundle
# into /src/missionweave_server/console/static (console/build.mjs).
RUN rm -rf src/gen && npm run --silent gen -- --path ../protos/missionweave/v1 \
    && npm run --silent typecheck && npm run --silent build \
    && test -s /src/missionweave_server/console/static/app.js

# ---------------------------------------------------------------- build the wheel
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md* ./
COPY client/ client/
COPY protos/ protos/
COPY missionweave/ missionweave/
COPY missionweave_server/ missionweave_server/
COPY --from=console /src/missionweave_server/console/static/ missionweave_server/console/static/
# Two distributions: the client (missionweave, built from missionweave/) and the server on top of it.
RUN pip wheel --wheel-dir /wheels ./client .

# ---------------------------------------------------------------- runtime
FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    MWP_LISTEN=0.0.0.0:50051 \
    MWP_DATA_DIR=/var/lib/missionweave \
    MWP_LOG_FORMAT=json \
    MWP_CONSOLE_LISTEN=0.0.0.0:50080 \
    MWP_CONSOLE_HOSTS=localhost:50080,127.0.0.1:50080
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels \
    && groupadd --system --gid 10001 mwp \
    && useradd --system --uid 10001 --gid mwp --home-dir /var/lib/missionweave --no-create-home mwp \
    && mkdir -p /var/lib/missionweave && chown mwp:mwp /var/lib/missionweave && chmod 0700 /var/lib/missionweave
USER 10001:10001
WORKDIR /var/lib/missionweave
EXPOSE 50051 50080
ENTRYPOINT ["mwp"]
CMD ["serve"]
