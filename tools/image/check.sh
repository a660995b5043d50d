#!/usr/bin/env bash
# Checks the image archive tools/image/build.sh wrote (`make image-check`; docs/image.md):
#
#   1. skopeo reads the archive and finds the ref missionweave:<version>;
#   2. umoci unpacks it into a runtime bundle; its config.json (what a container runtime would run) must
#      carry the Dockerfile's runtime contract: uid/gid 10001, `mwp serve`, /var/lib/missionweave, the env;
#   3. the bundle runs as k8s/*.yaml run it, without a container engine: in fresh mount, PID and network
#      namespaces (unshare), the root filesystem read-only, /tmp and the data dir writable (the manifests'
#      emptyDir volumes), as uid/gid 10001 with the config's env and working directory: the installed version,
#      the authority init container's `sh -c install ...`, `mwp serve` (on loopback, its own network
#      namespace), then `mwp health` and `mwp db status` from inside the image and the console's page
#      over HTTP, then SIGTERM and a clean exit.
#
# What this cannot prove (a real runtime would): cgroup limits, seccomp, dropped capabilities beyond
# running as non-root, kubelet's probes. Run as root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

VENV=${VENV:-.venv}
VERSION=$("$VENV/bin/python" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
REF="missionweave:$VERSION"
ARCHIVE=${1:-build/image/missionweave-$VERSION.oci.tar}
started=$SECONDS
step() { printf '==> [%3ds] %s\n' $((SECONDS - started)) "$*"; }

[ "$(id -u)" -eq 0 ] || { echo "image-check: run as root (unshare, mount and chroot need it)" >&2; exit 1; }
for tool in umoci skopeo unshare; do
    command -v "$tool" >/dev/null || { echo "image-check: $tool not found: apt-get install umoci skopeo" >&2; exit 1; }
done
[ -s "$ARCHIVE" ] || { echo "image-check: $ARCHIVE not found: make image" >&2; exit 1; }

work=$(mktemp -d -t mwp-image-check.XXXXXX)
trap 'rm -rf "$work"' EXIT

step "skopeo inspect oci-archive:$ARCHIVE:$REF"
skopeo inspect --config "oci-archive:$ARCHIVE:$REF" >"$work/image-config.json"

step "unpacking $REF into a runtime bundle (umoci unpack)"
mkdir "$work/layout"
tar -xf "$ARCHIVE" -C "$work/layout"
umoci unpack --image "$work/layout:$REF" "$work/bundle" >/dev/null

step "checking the runtime contract in the bundle's config.json"
# Prints the env (one per line) for the run below, after checking what k8s/*.yaml rely on.
"$VENV/bin/python" - "$work/bundle/config.json" >"$work/env" <<'PY'
import json
import sys

process = json.load(open(sys.argv[1]))["process"]
env = dict(item.split("=", 1) for item in process["env"])
wanted_env = {
    "MWP_LISTEN": "0.0.0.0:50051",
    "MWP_DATA_DIR": "/var/lib/missionweave",
    "MWP_LOG_FORMAT": "json",
    "MWP_CONSOLE_LISTEN": "0.0.0.0:50080",
    "MWP_CONSOLE_HOSTS": "localhost:50080,127.0.0.1:50080",
}
problems = [f"env {k}={env.get(k)!r}, wanted {v!r}" for k, v in wanted_env.items() if env.get(k) != v]
user = process["user"]
if (user["uid"], user["gid"]) != (10001, 10001):
    problems.append(f"user {user['uid']}:{user['gid']}, wanted 10001:10001")
if process["args"] != ["mwp", "serve"]:
    problems.append(f"args {process['args']}, wanted ['mwp', 'serve'] (entrypoint mwp, cmd serve)")
if process["cwd"] != "/var/lib/missionweave":
    problems.append(f"cwd {process['cwd']}, wanted /var/lib/missionweave")
if problems:
    sys.exit("image-check: the runtime contract is broken: " + "; ".join(problems))
print("\n".join(process["env"]))
PY
echo "    uid/gid 10001, mwp serve in /var/lib/missionweave, $(grep -c '^MWP_' "$work/env") MWP_ variables"
owner=$(stat -c '%u:%g %a' "$work/bundle/rootfs/var/lib/missionweave")
[ "$owner" = "10001:10001 700" ] || { echo "image-check: /var/lib/missionweave is $owner, wanted 10001:10001 700" >&2; exit 1; }

step "running the image (read-only root, uid 10001, own mount/PID/network namespaces): mwp serve, mwp health, mwp db status"
mkdir -m 0755 "$work/data" "$work/tmp"
chown 10001:10001 "$work/data"
chmod 1777 "$work/tmp"
export IMAGE_ROOT="$work/bundle/rootfs" IMAGE_DATA="$work/data" IMAGE_TMP="$work/tmp" IMAGE_ENV="$work/env" IMAGE_VERSION="$VERSION"
# shellcheck disable=SC2016  # the script below expands inside the namespaces, not here
unshare --mount --pid --net --fork --propagation private bash -euo pipefail -c '
root=$IMAGE_ROOT
# The layer read-only, as readOnlyRootFilesystem: true; /tmp and the data dir are the manifests volumes.
mount --bind "$root" "$root" && mount -o remount,bind,ro "$root"
mount --bind "$IMAGE_TMP" "$root/tmp"
mount --bind "$IMAGE_DATA" "$root/var/lib/missionweave"
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=0755,nosuid tmpfs "$root/dev"
for node in null zero full random urandom; do touch "$root/dev/$node"; mount --bind "/dev/$node" "$root/dev/$node"; done
ip link set lo up
mapfile -t env <"$IMAGE_ENV"
# The server listens on loopback of this network namespace (plain text is refused on 0.0.0.0).
env+=(MWP_LISTEN=127.0.0.1:50051 MWP_CONSOLE_LISTEN=127.0.0.1:50080 HOME=/var/lib/missionweave)
# chroot, env and sh each exec the next: a command started in the background is the PID that mwp gets.
in_image=(chroot --userspec=10001:10001 "$root" /usr/bin/env -i "${env[@]}" sh -c "cd /var/lib/missionweave && exec \"\$@\"" sh)
in_image() { "${in_image[@]}" "$@"; }

# mwp has no --version: the installed distributions must be the version pyproject.toml names.
versions=$(in_image python3 -c "from importlib.metadata import version as v; print(v(\"missionweave\"), v(\"missionweave-server\"))")
[ "$versions" = "$IMAGE_VERSION $IMAGE_VERSION" ] || { echo "installed missionweave, missionweave-server: $versions, wanted $IMAGE_VERSION" >&2; exit 1; }
echo "    missionweave and missionweave-server $IMAGE_VERSION installed; $(in_image python3 --version)"
if in_image touch /usr/local/write-test 2>/dev/null; then echo "the root filesystem is writable" >&2; exit 1; fi
# The authority init container (k8s/authority.yaml) copies its key with sh and install from the image.
in_image sh -c "echo key >/tmp/key && install -m 0600 /tmp/key /var/lib/missionweave/init-test && rm /var/lib/missionweave/init-test"

"${in_image[@]}" mwp serve >"$IMAGE_TMP/serve.log" 2>&1 &
server=$!
for i in $(seq 1 60); do
    if in_image mwp health >"$IMAGE_TMP/health.out" 2>&1; then break; fi
    if ! kill -0 "$server" 2>/dev/null || [ "$i" -eq 60 ]; then
        echo "mwp serve did not become healthy:" >&2; cat "$IMAGE_TMP/serve.log" "$IMAGE_TMP/health.out" >&2; exit 1
    fi
    sleep 1
done
sed "s/^/    mwp health: /" "$IMAGE_TMP/health.out"
in_image mwp db status | sed "s/^/    mwp db status: /"
# The console bundle the server wheel carries, served by the gateway.
python3 -c "
import sys, urllib.request
req = urllib.request.Request(\"http://127.0.0.1:50080/\", headers={\"Host\": \"localhost:50080\"})
page = urllib.request.urlopen(req, timeout=10).read().decode()
sys.exit(0 if \"app.js\" in page else \"the console page does not load app.js\")
"
echo "    console: http://127.0.0.1:50080/ serves the page and its bundle"
kill -TERM "$server"
status=0; wait "$server" || status=$?
[ "$status" -eq 0 ] || { echo "mwp serve exited $status on SIGTERM:" >&2; tail -n 20 "$IMAGE_TMP/serve.log" >&2; exit 1; }
echo "    SIGTERM: mwp serve drained and exited 0"
head -n 1 "$IMAGE_TMP/serve.log" | python3 -c "import json, sys; json.loads(sys.stdin.readline())" \
    || { echo "the server log is not JSON (MWP_LOG_FORMAT=json):" >&2; head -n 3 "$IMAGE_TMP/serve.log" >&2; exit 1; }
echo "    log: JSON lines (MWP_LOG_FORMAT=json)"
'
step "image check passed: $ARCHIVE"
