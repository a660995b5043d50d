#!/usr/bin/env bash
# Generate every Secret of the dev overlay into k8s/overlays/dev/secrets/ (git-ignored), which
# kustomization.yaml's secretGenerator reads: kubectl apply -k fails while they are missing, so
# nothing is deployed on a placeholder.
#
#   k8s/overlays/dev/make-secrets.sh [GATEWAY_NAME ...]      (then: kubectl apply -k k8s/overlays/dev)
#
# Writes: a random mesh token, the Authority and administrator keys (mwp keygen), a random PostgreSQL
# password and the matching MWP_DATABASE_URL, random S3 credentials (the SeaweedFS identity and the
# artifacts pods' AWS_* variables), and a throw-away mesh CA with one certificate per service
# (k8s/make-tls-certs.sh; the gateway's also names localhost and 127.0.0.1, for kubectl port-forward,
# and each GATEWAY_NAME: further names agents dial the gateway by).
#
# Refuses to overwrite: the Authority key signs every event, and the database already holds the
# password. Delete secrets/ only together with the cluster's data (the PVCs) you mean to start over.
#
# MWP (default: mwp on PATH) runs `mwp keygen`; NAMESPACE and CLUSTER_DOMAIN as in make-tls-certs.sh.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$HERE/secrets"
MWP=${MWP:-mwp}
NS=${NAMESPACE:-missionweave}
DOMAIN=${CLUSTER_DOMAIN:-cluster.local}

if [ -e "$OUT" ]; then
    echo "make-secrets.sh: $OUT exists; remove it first to make new keys (see the header)" >&2
    exit 1
fi
for tool in openssl "$MWP"; do
    command -v "$tool" >/dev/null || { echo "make-secrets.sh: $tool not found (set MWP=path/to/mwp)" >&2; exit 1; }
done

mkdir -p "$OUT.partial"
trap 'rm -rf "$OUT.partial"' EXIT
umask 077
cd "$OUT.partial"

openssl rand -hex 32 >mesh.token
"$MWP" keygen authority.key >/dev/null
"$MWP" keygen admin.key >/dev/null

pg_password=$(openssl rand -hex 24)
printf 'POSTGRES_PASSWORD=%s\n' "$pg_password" >postgres.env
printf 'MWP_DATABASE_URL=postgresql://missionweave:%s@postgres.%s.svc.%s:5432/missionweave\n' \
    "$pg_password" "$NS" "$DOMAIN" >database.env

access=$(openssl rand -hex 10)
secret=$(openssl rand -hex 20)
printf 'AWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n' "$access" "$secret" >s3.env
# SeaweedFS's S3 identities (weed s3 -config): the one the artifacts pods and the bucket Job use.
cat >s3.json <<JSON
{"identities": [{"name": "missionweave", "credentials": [{"accessKey": "$access", "secretKey": "$secret"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON

# localhost: the CLI and browsers reach the gateway through kubectl port-forward (local-access.yaml).
NAMESPACE="$NS" CLUSTER_DOMAIN="$DOMAIN" "$HERE/../../make-tls-certs.sh" tls localhost 127.0.0.1 "$@" >/dev/null
rm -f tls/secrets.yaml tls/*.csr tls/*.srl

cd "$HERE"
mv "$OUT.partial" "$OUT"
trap - EXIT
echo "wrote $OUT (keep tls/ca.key and admin.key: docs/operations.md)"
