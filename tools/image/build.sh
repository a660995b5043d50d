#!/usr/bin/env bash
# Builds the mesh image `missionweave:<version>` as an OCI image archive, from this repository and
# Debian's and PyPI's packages alone (no container registry, no container engine; docs/image.md):
#
#   1. the wheels: the client and the server (with the web console `make console` built into
#      missionweave_server/console/static/) and every dependency, as the Dockerfile's build stage makes them;
#   2. the root filesystem: mmdebstrap of Debian bookworm, variant essential plus python3 (3.11) and
#      ca-certificates (and libstdc++6, which grpcio's manylinux wheel links), the wheels installed into /usr/local with the image's own python3 (chrooted),
#      the mwp user and group (10001) and /var/lib/missionweave (0700), as one tar layer;
#   3. the image: umoci makes the OCI layout (the layer, the config: user, env, entrypoint `mwp`, cmd
#      `serve`, the Dockerfile's runtime stage), which GNU tar packs into build/image/missionweave-<version>.oci.tar.
#
# Run as root (mmdebstrap's root mode and the chroot need it): `make image`. SOURCE_DATE_EPOCH defaults to
# the last commit's time; every timestamp in the layer and the config is clamped to it.
# shellcheck disable=SC2016,SC2054  # mmdebstrap's hooks expand $1 (the root) themselves; commas are in env values
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

VENV=${VENV:-.venv}
SUITE=bookworm
# bookworm with its point-release updates and its security updates, as python:3.11-slim would carry.
MIRROR=${MWP_IMAGE_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${MWP_IMAGE_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SOURCES=("deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY_MIRROR $SUITE-security main")
OUT=build/image
WORK=$PWD/$OUT/work  # absolute: mmdebstrap's hooks run elsewhere
VERSION=$("$VENV/bin/python" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
REF="missionweave:$VERSION"
ARCHIVE=$OUT/missionweave-$VERSION.oci.tar
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
export SOURCE_DATE_EPOCH
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
started=$SECONDS
step() { printf '==> [%3ds] %s\n' $((SECONDS - started)) "$*"; }

[ "$(id -u)" -eq 0 ] || { echo "image: run as root (mmdebstrap's root mode and chroot need it)" >&2; exit 1; }
for tool in mmdebstrap umoci; do
    command -v "$tool" >/dev/null || { echo "image: $tool not found: apt-get install mmdebstrap umoci" >&2; exit 1; }
done

rm -rf "$WORK" && mkdir -p "$WORK/wheels"

step "building the wheels of the client and the server (with the web console) and their dependencies (pip wheel ./client .)"
test -s missionweave_server/console/static/app.js || { echo "image: run make console first" >&2; exit 1; }
# setuptools reuses an in-tree build/ directory: a module deleted since the last build would ship again.
rm -rf build/lib build/bdist.* client/build
"$VENV/bin/python" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$WORK/wheels" ./client .
# pip itself, only to install the wheels inside the root filesystem (run from its wheel, then removed).
"$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --dest "$WORK/pip" \
    "pip==$("$VENV/bin/python" -m pip --version | awk '{print $2}')"
echo "    $(find "$WORK/wheels" -name "*.whl" | wc -l) wheels, $(du -sh "$WORK/wheels" | cut -f1)"

step "building the root filesystem: mmdebstrap $SUITE (essential, python3, ca-certificates, libstdc++6) from $MIRROR (+ updates, security), the wheels into /usr/local"
# Documentation, man pages and translations are left out (dpkg path-exclude); the copyright files stay.
# Inside the chroot (env -i: no PIP_* or PYTHON* setting of the build machine leaks in): pip from its wheel installs the server and its dependencies into /usr/local (the only
# Python packages in the image; Debian's python3 marks itself externally managed, hence the flag), then
# compiles them with hash-checked .pyc files (stable across builds; the root is read-only at run time).
# The mwp user and group are written directly: useradd (passwd) is not in the essential set.
mmdebstrap --mode=root --variant=essential --format=tar \
    --include=python3,ca-certificates,libstdc++6 \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook="mkdir -p \"\$1/tmp/wheels\"" \
    --customize-hook="copy-in $WORK/wheels $WORK/pip /tmp/wheels" \
    --customize-hook='chroot "$1" env -i PATH=/usr/bin:/bin sh -c "set -- /tmp/wheels/pip/pip-*.whl && python3 \$1/pip install --quiet --no-index --no-cache-dir --disable-pip-version-check --root-user-action=ignore --no-warn-script-location --break-system-packages --no-compile --find-links /tmp/wheels/wheels missionweave-server"' \
    --customize-hook='chroot "$1" env -i PATH=/usr/bin:/bin python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash /usr/local/lib/python3.11' \
    --customize-hook='rm -rf "$1/tmp/wheels" "$1"/var/log/* "$1"/var/cache/ldconfig/aux-cache' \
    --customize-hook='echo "mwp:x:10001:" >>"$1/etc/group" && echo "mwp:!::" >>"$1/etc/gshadow"' \
    --customize-hook='echo "mwp:x:10001:10001::/var/lib/missionweave:/usr/sbin/nologin" >>"$1/etc/passwd" && echo "mwp:!:0::::::" >>"$1/etc/shadow"' \
    --customize-hook='install -d -o 10001 -g 10001 -m 0700 "$1/var/lib/missionweave"' \
    --customize-hook='chroot "$1" dpkg-query -W -f="\${Package} \${Version}\n" >"'"$WORK"'/packages.txt"' \
    --customize-hook='chroot "$1" env -i PATH=/usr/local/bin:/usr/bin:/bin mwp serve --help >/dev/null' \
    "$SUITE" "$WORK/rootfs.tar" "${SOURCES[@]}"
echo "    layer: $(du -h "$WORK/rootfs.tar" | cut -f1) uncompressed, $(wc -l <"$WORK/packages.txt") Debian packages"

step "packing the OCI image $REF (umoci: layer and config)"
# The runtime contract of the Dockerfile's runtime stage (docs/image.md); k8s/*.yaml depend on it.
ENV=(
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    LANG=C.UTF-8
    PYTHONDONTWRITEBYTECODE=1
    PYTHONUNBUFFERED=1
    MWP_LISTEN=0.0.0.0:50051
    MWP_DATA_DIR=/var/lib/missionweave
    MWP_LOG_FORMAT=json
    MWP_CONSOLE_LISTEN=0.0.0.0:50080
    MWP_CONSOLE_HOSTS=localhost:50080,127.0.0.1:50080
)
layout="$WORK/oci:$REF"
umoci init --layout "$WORK/oci"
umoci new --image "$layout"
umoci raw add-layer --image "$layout" --history.created "$CREATED" \
    --history.created_by "mmdebstrap $SUITE + pip install missionweave-server $VERSION (tools/image/build.sh)" "$WORK/rootfs.tar"
config_args=(--config.user 10001:10001 --config.workingdir /var/lib/missionweave
    --config.entrypoint mwp --config.cmd serve
    --config.exposedports 50051/tcp --config.exposedports 50080/tcp
    --config.label "org.opencontainers.image.title=MissionWeave"
    --config.label "org.opencontainers.image.version=$VERSION"
    --config.label "org.opencontainers.image.revision=$(git rev-parse HEAD)"
    --config.label "org.opencontainers.image.created=$CREATED"
    --created "$CREATED" --history.created "$CREATED" --history.created_by "tools/image/build.sh: runtime config"
    --clear=config.env)
for e in "${ENV[@]}"; do config_args+=(--config.env "$e"); done
umoci config --image "$layout" "${config_args[@]}"
umoci gc --layout "$WORK/oci"
# containerd (ctr images import, kind load image-archive) names an imported image after this annotation.
"$VENV/bin/python" - "$WORK/oci/index.json" "$REF" <<'PY'
import json
import sys

path, ref = sys.argv[1], sys.argv[2]
index = json.load(open(path))
(manifest,) = index["manifests"]
manifest["annotations"]["io.containerd.image.name"] = f"docker.io/library/{ref}"
json.dump(index, open(path, "w"), separators=(",", ":"), sort_keys=True)
PY

step "writing $ARCHIVE"
# An OCI image archive is the layout in a tar (what skopeo's oci-archive: transport reads and writes).
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner --mode=a+rX --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$WORK/oci" -cf "$ARCHIVE.part" oci-layout index.json blobs
mv "$ARCHIVE.part" "$ARCHIVE"
cp "$WORK/packages.txt" "$OUT/missionweave-$VERSION.packages.txt"
rm -rf "$WORK"
step "done: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1), sha256 $(sha256sum "$ARCHIVE" | cut -c1-16)…), ref $REF; Debian packages in $OUT/missionweave-$VERSION.packages.txt"
