#!/usr/bin/env bash
# Make a mesh CA and one certificate per service for the manifests in k8s/ (docs/tls.md), with openssl.
#
#   k8s/make-tls-certs.sh OUT_DIR [GATEWAY_NAME ...]
#
# GATEWAY_NAME: the names agents dial to reach the gateway from outside the cluster (DNS names or IP
# addresses), added to the gateway's certificate. Writes into OUT_DIR:
#
#   ca.crt, ca.key                 the mesh CA (keep ca.key offline: it issues every service's certificate)
#   <service>.crt, <service>.key   authority, membership, scheduling, artifacts, gateway: a certificate
#                                  for the service's cluster DNS name(s), naming the service with the URI
#                                  SAN spiffe://missionweave/<service>, for server and client authentication
#
# then create the Secrets the pods mount (or apply OUT_DIR/secrets.yaml, which this script also writes):
#
#   for s in authority membership scheduling artifacts gateway; do
#     kubectl -n missionweave create secret generic missionweave-tls-$s --type=kubernetes.io/tls \
#       --from-file=tls.crt=OUT_DIR/$s.crt --from-file=tls.key=OUT_DIR/$s.key --from-file=ca.crt=OUT_DIR/ca.crt
#   done
#
# NAMESPACE (default missionweave), CLUSTER_DOMAIN (default cluster.local) and DAYS (default 365) change
# the names and the validity. Agents verify the gateway with ca.crt (MWP_TLS_CA, --tls-ca).
set -euo pipefail

if [ $# -lt 1 ]; then
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
OUT=$1
shift
NS=${NAMESPACE:-missionweave}
DOMAIN=${CLUSTER_DOMAIN:-cluster.local}
DAYS=${DAYS:-365}
mkdir -p "$OUT"
umask 077

openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -sha256 -days "$DAYS" \
    -subj "/CN=MissionWeave mesh CA" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$OUT/ca.key" -out "$OUT/ca.crt" 2>/dev/null

: >"$OUT/secrets.yaml"
for service in authority membership scheduling artifacts gateway; do
    if [ "$service" = authority ] || [ "$service" = scheduling ]; then
        # Every pod of the StatefulSet: authority-N.authority-headless.<ns>.svc.<domain>, and so on.
        sans="DNS:*.$service-headless.$NS.svc.$DOMAIN"
    else
        sans="DNS:$service.$NS.svc.$DOMAIN"
    fi
    if [ "$service" = gateway ]; then
        for name in "$@"; do
            if [[ "$name" =~ ^[0-9.]+$ || "$name" == *:* ]]; then sans="$sans,IP:$name"; else sans="$sans,DNS:$name"; fi
        done
    fi
    sans="$sans,URI:spiffe://missionweave/$service"
    openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -sha256 \
        -subj "/CN=$service" -keyout "$OUT/$service.key" -out "$OUT/$service.csr" 2>/dev/null
    openssl x509 -req -in "$OUT/$service.csr" -CA "$OUT/ca.crt" -CAkey "$OUT/ca.key" -CAcreateserial \
        -sha256 -days "$DAYS" -out "$OUT/$service.crt" -extfile <(printf '%s\n' \
            "basicConstraints=critical,CA:FALSE" \
            "keyUsage=critical,digitalSignature" \
            "extendedKeyUsage=serverAuth,clientAuth" \
            "subjectAltName=$sans") 2>/dev/null
    rm -f "$OUT/$service.csr"
    {
        echo "---"
        echo "apiVersion: v1"
        echo "kind: Secret"
        echo "metadata: {name: missionweave-tls-$service, namespace: $NS, labels: {app.kubernetes.io/part-of: missionweave}}"
        echo "type: kubernetes.io/tls"
        echo "data:"
        echo "  tls.crt: $(base64 -w0 <"$OUT/$service.crt")"
        echo "  tls.key: $(base64 -w0 <"$OUT/$service.key")"
        echo "  ca.crt: $(base64 -w0 <"$OUT/ca.crt")"
    } >>"$OUT/secrets.yaml"
    echo "$OUT/$service.crt: $sans"
done
rm -f "$OUT/ca.srl"
echo "$OUT/secrets.yaml: the five Secrets missionweave-tls-<service> (kubectl apply -f; it holds private keys)"
