# MissionWeave mesh image: one binary (`mwp`), every service selected by `mwp serve --service NAME`.
#
#   docker build -t missionweave:0.1.0 .
#   docker run --rm -p 50051:50051 -v "$PWD/tls:/tls:ro" missionweave:0.1.0 serve --listen 0.0.0.0:50051 \
#       --tls-cert /tls/server.crt --tls-key /tls/server.key
#
# Plain text on 0.0.0.0 is refused unless `--insecure` (MWP_INSECURE=1) says so; `serve --tls-auto` makes
# a throw-away CA and certificate in the data dir instead (docs/tls.md).
#
# The protobuf modules are generated from protos/ by the client's build (client/setup.py's build_py), so the
# image never depends on generated files in the build context.

# ---------------------------------------------------------------- build the wheel
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md* ./
COPY client/ client/
COPY protos/ protos/
COPY missionweave/ missionweave/
COPY missionweave_server/ missionweave_server/
# Two distributions: the client (missionweave, built from missionweave/) and the server on top of it.
RUN pip wheel --wheel-dir /wheels ./client .

# ---------------------------------------------------------------- runtime
FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    MWP_LISTEN=0.0.0.0:50051 \
    MWP_DATA_DIR=/var/lib/missionweave \
    MWP_LOG_FORMAT=json
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels \
    && groupadd --system --gid 10001 mwp \
    && useradd --system --uid 10001 --gid mwp --home-dir /var/lib/missionweave --no-create-home mwp \
    && mkdir -p /var/lib/missionweave && chown mwp:mwp /var/lib/missionweave && chmod 0700 /var/lib/missionweave
USER 10001:10001
WORKDIR /var/lib/missionweave
EXPOSE 50051
ENTRYPOINT ["mwp"]
CMD ["serve"]
