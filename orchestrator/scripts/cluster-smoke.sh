#!/usr/bin/env bash
# Cluster smoke test of kudos-orchestrator against a real etcd + kube-apiserver (the e2e
# crate's upstream builds in e2e/_out/bin): Node/Pod watches, readiness, extender
# filter/prioritize/bind (binding created, idempotent), ConfigMap store, and gRPC callers
# authenticated by TokenReview with pod-bound service-account tokens (node-name extra).
# Usage: orchestrator/scripts/cluster-smoke.sh   (run from the repository root, after
# `cargo build -p kudos-orchestrator`). Leaves logs in $DIR.
set -euo pipefail
BIN=${KUDOS_E2E_BIN_DIR:-e2e/_out/bin}
ORCH=${KUDOS_ORCHESTRATOR:-target/debug/kudos-orchestrator}
DIR=$(mktemp -d /tmp/kudos-orch-smoke.XXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
cd "$DIR"
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj /CN=smoke-ca 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=kube-apiserver 2>/dev/null
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 1 \
  -extfile <(printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n') 2>/dev/null
openssl genrsa -out sa.key 2048 2>/dev/null && openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
echo "admintoken,admin,admin,system:masters" > tokens.csv
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
EC=$(port); EP=$(port); AP=$(port); HP=$(port); GP=$(port)
"$OLDPWD/$BIN/etcd" --name=s --data-dir=etcd --listen-client-urls=http://127.0.0.1:$EC --advertise-client-urls=http://127.0.0.1:$EC \
  --listen-peer-urls=http://127.0.0.1:$EP --initial-advertise-peer-urls=http://127.0.0.1:$EP --initial-cluster=s=http://127.0.0.1:$EP \
  --unsafe-no-fsync=true --log-level=warn > etcd.log 2>&1 & PIDS+=($!)
"$OLDPWD/$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:$EC --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
  --secure-port=$AP --cert-dir=certs --tls-cert-file=server.crt --tls-private-key-file=server.key --client-ca-file=ca.crt \
  --token-auth-file=tokens.csv --authorization-mode=RBAC --service-account-key-file=sa.pub --service-account-signing-key-file=sa.key \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local --service-cluster-ip-range=10.0.0.0/24 \
  --disable-admission-plugins=TaintNodesByCondition,ServiceAccount --v=1 > apiserver.log 2>&1 & PIDS+=($!)
k() { local m=$1 p=$2; shift 2; curl -sf --cacert ca.crt -H "Authorization: Bearer admintoken" -H "Content-Type: ${CT:-application/json}" -X "$m" "https://127.0.0.1:$AP$p" "$@"; }
for _ in $(seq 60); do k GET /readyz >/dev/null 2>&1 && break; sleep 1; done
cat > kubeconfig <<KC
apiVersion: v1
kind: Config
clusters: [{name: s, cluster: {server: "https://127.0.0.1:$AP", certificate-authority: $DIR/ca.crt}}]
users: [{name: a, user: {token: admintoken}}]
contexts: [{name: s, context: {cluster: s, user: a}}]
current-context: s
KC
k POST /api/v1/namespaces -d '{"metadata":{"name":"kudos-system"}}' >/dev/null
for n in n1 n2; do
  k POST /api/v1/nodes -d "{\"metadata\":{\"name\":\"$n\",\"labels\":{\"kudos.dev/gpu-vendor\":\"nvidia\",\"kudos.dev/gpu-model\":\"Tesla-T4\"}}}" >/dev/null
  CT=application/merge-patch+json k PATCH /api/v1/nodes/$n/status -d '{"status":{"allocatable":{"cpu":"8","memory":"32Gi","pods":"110","kudos.dev/gpu":"4"},"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"ok","lastHeartbeatTime":"2026-01-01T00:00:00Z","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}' >/dev/null
done
k POST /api/v1/namespaces/default/serviceaccounts -d '{"metadata":{"name":"agent"}}' >/dev/null
k POST /api/v1/namespaces/default/pods -d '{"metadata":{"name":"agent-n1"},"spec":{"serviceAccountName":"agent","nodeName":"n1","containers":[{"name":"a","image":"x"}]}}' >/dev/null
PUID=$(k GET /api/v1/namespaces/default/pods/agent-n1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["metadata"]["uid"])')
k POST /api/v1/namespaces/default/serviceaccounts/agent/token -d "{\"spec\":{\"expirationSeconds\":3600,\"boundObjectRef\":{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"name\":\"agent-n1\",\"uid\":\"$PUID\"}}}" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"]["token"])' > agent.token
"$OLDPWD/$ORCH" --kubeconfig kubeconfig --http-listen 127.0.0.1:$HP --grpc-listen 127.0.0.1:$GP --store config-map > orch.log 2>&1 & PIDS+=($!)
for _ in $(seq 60); do curl -sf 127.0.0.1:$HP/readyz >/dev/null && break; sleep 0.5; done
curl -sf 127.0.0.1:$HP/readyz >/dev/null || { echo "orchestrator not ready"; tail orch.log; exit 1; }
k POST /api/v1/namespaces/default/pods -d '{"metadata":{"name":"train","labels":{"kudos.dev/class":"resnet50"}},"spec":{"containers":[{"name":"a","image":"x","resources":{"requests":{"cpu":"1","kudos.dev/gpu":"1"},"limits":{"kudos.dev/gpu":"1"}}}]}}' > pod.json
python3 -c 'import json; print(json.dumps({"Pod": json.load(open("pod.json")), "Nodes": None, "NodeNames": ["n1","n2","n3"]}))' > args.json
F=$(curl -sf -XPOST 127.0.0.1:$HP/kudos/v1/filter -d @args.json); echo "filter: $F"
echo "$F" | grep -q '"NodeNames":\["n1","n2"\]' && echo "$F" | grep -q '"n3":' || { echo FAIL filter; exit 1; }
echo "prioritize: $(curl -sf -XPOST 127.0.0.1:$HP/kudos/v1/prioritize -d @args.json)"
PODUID=$(python3 -c 'import json; print(json.load(open("pod.json"))["metadata"]["uid"])')
BIND="{\"PodName\":\"train\",\"PodNamespace\":\"default\",\"PodUID\":\"$PODUID\",\"Node\":\"n2\"}"
for _ in 1 2; do R=$(curl -sf -XPOST 127.0.0.1:$HP/kudos/v1/bind -d "$BIND"); [ "$R" = '{"Error":""}' ] || { echo "FAIL bind: $R"; exit 1; }; done
k GET /api/v1/namespaces/default/pods/train | grep -q '"nodeName": "n2"' || { echo FAIL bound; exit 1; }
sleep 1
curl -sf 127.0.0.1:$HP/state | python3 -c 'import json,sys; s=json.load(sys.stdin); f={n["name"]: n["free_devices"] for n in s["nodes"]}; assert f=={"n1":4,"n2":3}, f; print("free devices", f)'
cd "$OLDPWD"
KUDOS_SMOKE_GRPC=http://127.0.0.1:$GP KUDOS_SMOKE_TOKEN=$(cat "$DIR/agent.token") \
  cargo test -p kudos-orchestrator --test cluster_smoke -- --ignored
cd "$DIR"
k GET /api/v1/namespaces/kudos-system/configmaps/kudos-orchestrator-state | grep -q 'nvidia.com/gpu' || { echo FAIL configmap; exit 1; }
echo "cluster smoke: OK ($DIR)"
