#!/usr/bin/env bash
# Regenerate the release fixture tests/release_fixtures/<release>/{sqlite,postgres}/ (README.md).
#
#   tests/release_fixtures/regenerate.sh [RELEASE]        (default v0.1.0; `make release-fixture`)
#
# Makes a temporary `git worktree` of the release tag, and for each backend starts that release's
# `mwp serve` from it (PYTHONPATH=the worktree, this checkout's .venv python) on a fresh store, runs
# fill.py stage 1 against it, stops it, rotates the Authority key with the release's
# `mwp authority rotate-key`, starts it again, runs fill.py stage 2 (which writes expected.json),
# stops it and writes the store as text, the data directory's keys/ and blobs/, the identities'
# keys and expected.json into the fixture.
#
# Backends: BACKENDS="sqlite postgres" by default; PostgreSQL uses MWP_TEST_POSTGRES_URL, whose
# public schema is EMPTIED first (DROP SCHEMA public CASCADE). Needs sqlite3, psql and pg_dump.
set -euo pipefail
export PGOPTIONS="--client-min-messages=warning"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
RELEASE=${1:-v0.1.0}
PY=${PYTHON:-$ROOT/.venv/bin/python}
BACKENDS=${BACKENDS:-sqlite postgres}
OUT=$HERE/$RELEASE

git -C "$ROOT" rev-parse --verify --quiet "refs/tags/$RELEASE" >/dev/null || { echo "regenerate: no tag $RELEASE" >&2; exit 2; }
case " $BACKENDS " in
*" postgres "*) [ -n "${MWP_TEST_POSTGRES_URL:-}" ] || { echo "regenerate: set MWP_TEST_POSTGRES_URL (or BACKENDS=sqlite)" >&2; exit 2; } ;;
esac

TMP=$(mktemp -d "${TMPDIR:-/tmp}/mwp-release-fixture.XXXXXX")
WT=$TMP/worktree
SERVER_PID=""

cleanup() {
	if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
		kill -TERM "$SERVER_PID" 2>/dev/null || true
		wait "$SERVER_PID" 2>/dev/null || true
	fi
	git -C "$ROOT" worktree remove --force "$WT" 2>/dev/null || true
	rm -rf "$TMP"
}
trap cleanup EXIT

echo "==> worktree of $RELEASE in $WT"
git -C "$ROOT" worktree add --detach --quiet "$WT" "$RELEASE"
(cd "$WT" && PYTHONPATH="$WT" "$PY" -m missionweave.codegen >/dev/null 2>&1)

# The release's own code, from its worktree: the worktree first on the path, and as the current
# directory (python -m and the mesh's child processes put it before everything else).
release() { (cd "$WT" && env PYTHONPATH="$WT" MWP_CONTEXT_DIR="$TMP/contexts" "$@"); }

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# serve DATA_DIR URL LOG: the release's mesh on a free port, in the background; sets TARGET.
serve() {
	local data=$1 url=$2 log=$3 port
	port=$(free_port)
	TARGET=127.0.0.1:$port
	# exec: $! is the mesh itself, which SIGTERM stops in order (exit 0).
	(cd "$WT" && exec env PYTHONPATH="$WT" MWP_DATA_DIR="$data" MWP_DATABASE_URL="$url" MWP_METRICS_LISTEN= \
		MWP_LOG_LEVEL=warning "$PY" -m missionweave.cli serve --listen "$TARGET") >>"$log" 2>&1 &
	SERVER_PID=$!
	local deadline=$((SECONDS + 60))
	until release "$PY" -m missionweave.cli --target "$TARGET" --timeout 2 health >/dev/null 2>&1; do
		kill -0 "$SERVER_PID" 2>/dev/null || { echo "regenerate: mwp serve exited; its log:" >&2; cat "$log" >&2; exit 1; }
		[ $SECONDS -lt $deadline ] || { echo "regenerate: mwp serve did not become healthy" >&2; exit 1; }
		sleep 0.2
	done
}

stop() {
	local log=$1 rc=0
	kill -TERM "$SERVER_PID"
	wait "$SERVER_PID" || rc=$?
	SERVER_PID=""
	[ $rc -eq 0 ] || { echo "regenerate: mwp serve exited $rc on SIGTERM; its log:" >&2; cat "$log" >&2; exit 1; }
}

for backend in $BACKENDS; do
	echo "==> $backend"
	dir=$TMP/$backend
	data=$dir/data
	work=$dir/work
	mkdir -p "$dir"
	url=""
	if [ "$backend" = postgres ]; then
		url=$MWP_TEST_POSTGRES_URL
		psql_url=${url/postgresql+asyncpg:/postgresql:}
		psql "$psql_url" -q -v ON_ERROR_STOP=1 -c 'DROP SCHEMA public CASCADE; CREATE SCHEMA public;' >/dev/null
	fi
	fill() { release "$PY" "$HERE/fill.py" --target "$TARGET" --admin-key "$data/keys/admin.key" --data-dir "$data" \
		--work-dir "$work" --backend "$backend" --release "$RELEASE" "$@"; }

	serve "$data" "$url" "$dir/serve.log"
	fill --stage 1
	stop "$dir/serve.log"
	echo "    rotating the Authority key"
	release env MWP_DATA_DIR="$data" MWP_DATABASE_URL="$url" \
		"$PY" -m missionweave.cli authority rotate-key --reason "upgrade fixture: a rotation between two fills" >/dev/null
	serve "$data" "$url" "$dir/serve.log"
	fill --stage 2 --expected "$work/expected.json"
	stop "$dir/serve.log"

	target=$OUT/$backend
	rm -rf "$target"
	mkdir -p "$target/data" "$target/identities"
	if [ "$backend" = sqlite ]; then
		sqlite3 "$data/missionweave.db" .dump >"$target/database.sql"
	else
		# pg_dump 15.14+ brackets its output with \restrict/\unrestrict and a random key: left out,
		# so that the fixture is the same for the same data and older psql can load it.
		pg_dump --no-owner --no-privileges --format=plain "$psql_url" | grep -v -E '^\\(un)?restrict ' >"$target/database.sql"
		psql "$psql_url" -q -v ON_ERROR_STOP=1 -c 'DROP SCHEMA public CASCADE; CREATE SCHEMA public;' >/dev/null
	fi
	cp -r "$data/keys" "$target/data/keys"
	rm -f "$target/data/keys/"*.lock
	(cd "$data" && find blobs -path blobs/tmp -prune -o -type f -print | sort | while read -r f; do
		mkdir -p "$target/data/$(dirname "$f")"
		cp "$f" "$target/data/$f"
	done)
	cp "$work/identities/"*.key "$target/identities/"
	cp "$work/expected.json" "$target/expected.json"
	echo "    wrote $target ($(find "$target" -type f | wc -l) files, $(find "$target" -type f -printf '%s\n' | awk '{n += $1} END {print n}') bytes)"
done
echo "==> done: $OUT"
