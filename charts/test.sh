#!/usr/bin/env bash
# Tests of the Helm chart (charts/kudos) and of deploy/, its rendered output:
#   1. helm lint, default and non-default values;
#   2. helm template with default and non-default values renders what those values promise;
#   3. values that break values.schema.json fail with a message naming the field;
#   4. deploy/ is in sync with the chart (charts/render-deploy --check);
#   5. every flag the chart passes and docs/operators.md names is in the binary's --help, and the
#      orchestrator starts with the configuration file the chart writes;
#   6. the rendered objects, hooks included, are accepted by a real kube-apiserver (server-side
#      apply, dryRun=All, strict field validation), and a broken object is refused;
#   7. stored for real, the chart's RBAC lets kube-scheduler (chart's configuration) take its Lease
#      and the orchestrator (chart's configuration) sync and become ready.
# Step 5 needs the Kudos binaries (cargo build --bins, or KUDOS_BIN_DIR); steps 6-7 etcd,
# kube-apiserver and kube-scheduler (e2e/build, or KUDOS_E2E_BIN_DIR), which they run through
# the test kit's kudos-e2e-up and kudos-e2e-kube-scheduler (cargo build -p kudos-e2e). Without them they skip, or fail when
# KUDOS_E2E_REQUIRE=1. Helm is built by charts/build-helm (cached). Needs python3-yaml.
set -euo pipefail
cd "$(dirname "$0")/.."

HELM=charts/_out/bin/helm
KUBE_VERSION=v1.37.2
failures=0
pass() { printf 'ok    %s\n' "$*"; }
fail() { printf 'FAIL  %s\n' "$*" >&2; failures=$((failures + 1)); }

charts/build-helm
tmp=$(mktemp -d)
pids=()
opid=""
cleanup() {
  # Newest first (kube-scheduler before the control plane it talks to). The control plane
  # (kudos-e2e-up) stops its kube-apiserver and etcd itself on SIGTERM, each with a bounded
  # wait, so it gets 30 s before SIGKILL (which would leave them running).
  local all=($opid) i p
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do all+=("${pids[i]}"); done
  for p in "${all[@]}"; do
    kill "$p" 2>/dev/null || continue
    for _ in $(seq 1 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  for p in "${all[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

tpl() { "$HELM" template kudos charts/kudos --namespace kudos-system --kube-version "$KUBE_VERSION" "$@"; }

# Non-default values a cluster operator would plausibly set.
cat > "$tmp/custom.yaml" <<'V'
image: {registry: registry.example.com/ml, tag: "1.2.3", pullSecrets: [regcred]}
unifiedResourceName: accel.example.com/device
kubeletDir: /var/snap/microk8s/common/var/lib/kubelet
nvidia: {runtimeClassName: nvidia, driverLibraryDir: /usr/lib64, devDir: ""}
devicePlugin: {backends: [nvidia]}
orchestrator:
  rollout: {enabled: true, repository: registry.example.com/ml/kudos-derived, credentialsSecret: push-creds}
  scheduling: {threshold_factor: 1.5}
scheduler: {schedulerName: gpu-scheduler, replicas: 1, image: {tag: v1.35.0}, extender: {ignorable: true}}
tls: {mode: existingSecret, existingSecret: my-tls, existingClientSecret: my-client-tls}
uninstall: {deleteState: true}
dra: {allocationApi: auto, vendorClasses: [nvidia]}
V
cat > "$tmp/minimal.yaml" <<'V'
scheduler: {enabled: false}
nodeAgent: {enabled: false}
tls: {mode: certManager, certManager: {issuerRef: {name: ca-issuer, kind: ClusterIssuer}}, caBundle: "-----BEGIN CERTIFICATE-----\\n...\\n-----END CERTIFICATE-----\\n"}
orchestrator: {podDisruptionBudget: {enabled: false}}
V

# --- 1. lint
for v in "" "$tmp/custom.yaml" "$tmp/minimal.yaml"; do
  if out=$("$HELM" lint --strict charts/kudos --namespace kudos-system --kube-version "$KUBE_VERSION" ${v:+-f "$v"} 2>&1); then
    pass "helm lint ${v:+-f $(basename "$v")}"
  else
    fail "helm lint ${v:+-f $(basename "$v")}:"$'\n'"$out"
  fi
done

# --- 2. template
tpl > "$tmp/default.yaml"
tpl -f "$tmp/custom.yaml" > "$tmp/custom-out.yaml"
tpl -f "$tmp/minimal.yaml" > "$tmp/minimal-out.yaml"
has() { # has <file> <fixed string> <what it shows>
  if grep -qF -- "$2" "$1"; then pass "$3"; else fail "$3: '$2' not in $(basename "$1")"; fi
}
hasnt() {
  if grep -qF -- "$2" "$1"; then fail "$3: '$2' in $(basename "$1")"; else pass "$3"; fi
}
count() { # count <file> <fixed string> <n> <what>
  local n; n=$(grep -cF -- "$2" "$1" || true)
  if [[ $n == "$3" ]]; then pass "$4"; else fail "$4: '$2' $n times in $(basename "$1"), want $3"; fi
}
d=$tmp/default.yaml c=$tmp/custom-out.yaml m=$tmp/minimal-out.yaml
tpl --set nvidia.devDir=/dev > "$tmp/devdir.yaml"
tpl --set orchestrator.replicas=1 > "$tmp/one-replica.yaml"
count "$tmp/devdir.yaml" "terminationMessagePath: /run/termination-log" 2 "devDir set: plugin and agent keep the termination log off the read-only /dev"
has $d "image: localhost/kudos/kudos-orchestrator:0.1.0" "default images: registry localhost, tag appVersion"
has $d "image: registry.k8s.io/kube-scheduler:$KUBE_VERSION" "scheduler image follows the cluster's version"
has $d "- schedulerName: kudos" "second scheduler profile is 'kudos'"
has $d "urlPrefix: https://kudos-orchestrator-extender.kudos-system.svc:8888/kudos/v1" "extender URL is the HTTPS port of the Service of every replica (followers answer the extender)"
has $d "sessionAffinity: ClientIP" "one kube-scheduler's calls for a pod reach one replica"
has "$tmp/one-replica.yaml" "urlPrefix: https://kudos-orchestrator.kudos-system.svc:8888/kudos/v1" "one replica: the extender URL is the orchestrator Service's"
hasnt "$tmp/one-replica.yaml" "name: kudos-orchestrator-extender" "one replica: no extender Service"
has $d "enableHTTPS: true" "kube-scheduler calls the extender over HTTPS"
has $d "certFile: /etc/kudos-scheduler-tls/tls.crt" "kube-scheduler presents its client certificate"
has $d "  name: kudos-scheduler-client-tls" "client certificate Secret generated"
has $d "secretName: kudos-scheduler-client-tls" "client certificate mounted into the scheduler"
has $d "extender: clientCertificate" "orchestrator requires the scheduler's client certificate"
has $d "read: kubernetes" "orchestrator reads need TokenReview + RBAC"
has $d "nonResourceURLs: [/state, /status, /metrics, /explain/*]" "ClusterRole kudos-reader for readers"
has $d "kind: NetworkPolicy" "NetworkPolicy on the orchestrator"
has $d "scheme: HTTPS" "orchestrator probes over HTTPS"
has $d "kind: MutatingWebhookConfiguration" "admission webhook gives GPU pods Kudos' scheduler"
has $d "podSchedulerName: kudos" "orchestrator serves the webhook for scheduler kudos"
has $d "failurePolicy: Ignore" "webhook never blocks pod creation"
hasnt $m "kind: MutatingWebhookConfiguration" "scheduler disabled: no webhook"
count $d "kind: CustomResourceDefinition" 2 "KudosNode and KudosClass CRDs for kubectl get"
has $d "resources: [kudosnodes, kudosclasses]" "orchestrator may write KudosNode/KudosClass objects"
hasnt $d "helm.sh/resource-policy: keep" "CRDs go with helm uninstall by default"
tpl --set uninstall.keepCRDs=true > "$tmp/keep-crds.yaml"
count "$tmp/keep-crds.yaml" "helm.sh/resource-policy: keep" 2 "uninstall.keepCRDs keeps both CRDs"
has $c "secretName: my-client-tls" "existing client certificate Secret is mounted"
count $d "--orchestrator-url=https://kudos-orchestrator.kudos-system.svc:8889" 1 "node agent gets the orchestrator gRPC address (TLS)"
count $d "--orchestrator-addr=https://kudos-orchestrator.kudos-system.svc:8889" 1 "device plugin gets the orchestrator gRPC address (TLS)"
count $d "--orchestrator-ca-file=/etc/kudos-ca/ca.crt" 2 "plugin and agent verify the orchestrator with its CA"
count $d "configMap: {name: kudos-orchestrator-ca}" 2 "plugin and agent mount only the CA (a ConfigMap), never the key's Secret"
count $d "audience: kudos-orchestrator" 2 "plugin and agent get a token for audience kudos-orchestrator"
hasnt $d "/run/kudos/nvml-lib" "by default the NVIDIA toolkit delivers NVML, no host driver path"
hasnt $d "mountPath: /dev" "by default the NVIDIA toolkit delivers the device nodes, no /dev mount"
count $c "value: /run/kudos/nvml-lib/libnvidia-ml.so.1" 2 "driverLibraryDir set: plugin and agent load NVML from the host driver directory"
count $d "name: NVIDIA_VISIBLE_DEVICES" 2 "plugin and agent ask the NVIDIA toolkit for the devices"
count $d "automountServiceAccountToken: false" 1 "only the device plugin (no API calls) goes without an API token"
hasnt $d "kind: DeviceClass" "no DeviceClasses unless dra.allocationApi asks for DRA"
has $c "extendedResourceName: accel.example.com/device" "DRA: kudos-gpu backs the unified name (KEP-5004)"
count $c "kind: DeviceClass" 2 "DRA: kudos-gpu plus one class per listed vendor"
has $c "allocationApi: auto" "DRA: the orchestrator gets the allocation-API policy"
count $c "resources: [resourceslices]" 2 "DRA: the plugin writes its slice, the orchestrator reads slices"
count $d "resources: [resourceslices]" 0 "no ResourceSlice access unless dra.allocationApi asks for DRA"
has $c "path: /var/snap/microk8s/common/var/lib/kubelet/plugins_registry" "DRA: the plugin reaches the kubelet's plugin registry under kubeletDir"
has $d "{key: kudos.dev/plugin-group, operator: DoesNotExist}" "bootstrap plugin stays off nodes a rendered plugin group owns"
has $d "resourceNames: [kudos-scheduler]" "scheduler may update only its own lease"
has $d "helm.sh/hook: post-delete" "uninstall cleanup Job is a post-delete hook"
has $d 'grafana_dashboard: "1"' "Grafana dashboard ConfigMap for the sidecar"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["panels"] and all(t["expr"] for p in d["panels"] for t in p["targets"])' \
  charts/kudos/dashboards/kudos.json && pass "dashboard JSON parses, every panel queries" || fail "dashboard JSON"
has $d "- uninstall" "the cleanup Job runs kudos-orchestrator uninstall"
hasnt $d "delete-state-configmap" "state kept on uninstall by default"
has $c "- --delete-state-configmap=kudos-orchestrator-state" "uninstall.deleteState deletes the state ConfigMap"
tpl --show-only templates/orchestrator-rbac.yaml > "$tmp/rbac-default.yaml"
tpl --show-only templates/orchestrator-rbac.yaml -f "$tmp/custom.yaml" > "$tmp/rbac-custom.yaml"
hasnt "$tmp/rbac-default.yaml" "resources: [daemonsets]" "rollout off: orchestrator cannot touch DaemonSets"
hasnt "$tmp/rbac-default.yaml" "verbs: [patch]" "rollout off: orchestrator cannot label nodes"
has "$tmp/rbac-custom.yaml" "resources: [daemonsets]" "rollout on: orchestrator manages plugin DaemonSets"
has $d "kind: Secret" "self-signed TLS Secret by default"
count $c "accel.example.com/device" 10 "custom resource name reaches config, plugin, agent, scheduler, webhook (rollout copies the plugin pod) and the DRA DeviceClass (field and comment)"
has $c "image: registry.example.com/ml/kudos/kudos-device-plugin:1.2.3" "custom registry and tag"
count $c "runtimeClassName: nvidia" 2 "runtime class on plugin and agent"
has $c "path: /var/snap/microk8s/common/var/lib/kubelet/device-plugins" "custom kubelet directory"
hasnt $c "mountPath: /dev" "devDir empty: no /dev mount"
has $c -- "--backends=nvidia" "plugin backends"
has $c "repository: registry.example.com/ml/kudos-derived" "rollout repository in the orchestrator config"
has $c "podTemplateFrom: kudos-device-plugin-bootstrap" "rendered plugin groups run the bootstrap plugin's pod (orchestrator address, token, NVML delivery)"
has $c "resourceNames: [push-creds]" "orchestrator reads only the push-credentials Secret"
has $c "secretName: my-tls" "existing TLS Secret is mounted"
has $c "ignorable: true" "extender ignorable on request"
has $c "- schedulerName: gpu-scheduler" "custom scheduler name"
hasnt $m "serviceAccountName: kudos-scheduler" "scheduler disabled: no kube-scheduler pods"
hasnt $m "name: kudos-scheduler-config" "scheduler disabled: no kube-scheduler configuration"
count $m "kind: DaemonSet" 1 "node agent disabled: only the plugin DaemonSet"
has $m "kind: Certificate" "cert-manager Certificate"
hasnt $m "kind: PodDisruptionBudget" "PDB can be switched off"

# --- 3. schema
bad() { # bad <expected text in the error> <helm args...>
  local want=$1; shift
  if out=$(tpl "$@" 2>&1); then
    fail "values $* accepted; want an error naming '$want'"
  elif grep -qF -- "$want" <<<"$out"; then
    pass "values $* refused naming '$want'"
  else
    fail "values $* refused without naming '$want':"$'\n'"$out"
  fi
}
bad "unifiedResourceName" --set unifiedResourceName=gpu
bad "/orchestrator/replicas" --set orchestrator.replicas=6
bad "/orchestrator/rollout/repository" --set orchestrator.rollout.enabled=true
bad "/scheduler/schedulerName" --set scheduler.schedulerName=default-scheduler
bad "/image/pullPolicy" --set image.pullPolicy=Sometimes
bad "/tls/existingSecret" --set tls.mode=existingSecret
bad "/tls/existingClientSecret" --set tls.mode=existingSecret --set tls.existingSecret=s
bad "/orchestrator/access/read" --set orchestrator.access.read=everyone
bad "/tls/mode" --set tls.mode=acme
bad "tls.caBundle" --set tls.mode=certManager --set tls.certManager.issuerRef.name=x
bad "replica" --set orchestrator.replica=1
bad "/gpuNodes/nodeSelector/kudos.dev~1gpu-node" --set gpuNodes.nodeSelector.kudos\\.dev/gpu-node=true
bad "/kubeletDir" --set kubeletDir=var/lib/kubelet
bad "/orchestrator/ports/grpc" --set orchestrator.ports.grpc=70000
bad "/devicePlugin/backends" --set "devicePlugin.backends={intel}"

# --- 4. deploy/ in sync
if out=$(charts/render-deploy --check 2>&1); then pass "deploy/ matches the chart"; else fail "$out"; fi

# --- 5. every flag the chart passes and the docs name exists in the binary's --help
bins=${KUDOS_BIN_DIR:-${CARGO_TARGET_DIR:-target}/debug}
python3 charts/check-flags.py "$d" docs/operators.md "$bins" || case $? in
  2) msg="no Kudos binaries in $bins (cargo build --bins, or set KUDOS_BIN_DIR)"
     if [[ ${KUDOS_E2E_REQUIRE:-} == 1 ]]; then fail "$msg"; else echo "skip  flags against --help: $msg"; fi ;;
  *) fail "flags against --help" ;;
esac

# The orchestrator starts with the configuration file the chart writes (it refuses unknown fields
# and bad values at start, exit code 2), default and custom values alike.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
config_of() { tpl --show-only templates/orchestrator-config.yaml "$@" | python3 -c 'import sys, yaml; print(yaml.safe_load(sys.stdin)["data"]["config.yaml"])' | sed "s|/etc/kudos-tls/|$tls/|"; }
# The Secret the chart mounts at /etc/kudos-tls, made like Helm makes it (a CA, a certificate for
# the Service name and loopback).
tls=$tmp/kudos-tls; mkdir -p "$tls"
(
  cd "$tls"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj /CN=kudos-orchestrator-ca
  openssl req -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr -subj /CN=kudos-orchestrator.kudos-system.svc
  printf 'subjectAltName=DNS:kudos-orchestrator.kudos-system.svc,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > san.cnf
  openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tls.crt -days 1 -extfile san.cnf
  # kube-scheduler's client certificate (the chart's Secret kudos-scheduler-client-tls)
  openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=kudos-scheduler
  printf 'subjectAltName=DNS:kudos-scheduler\nextendedKeyUsage=clientAuth\n' > client.cnf
  openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 1 -extfile client.cnf
) >/dev/null 2>&1
orch_curl() { curl -s --cacert "$tls/ca.crt" "$@"; }
if [[ -x $bins/kudos-orchestrator ]]; then
  for v in "" "$tmp/custom.yaml"; do
    # standalone has no API server for TokenReview: reads open here (step 7 checks them)
    config_of ${v:+-f "$v"} | sed 's/^\( *\)read: kubernetes$/\1read: open/' > "$tmp/orchestrator.yaml"
    hp=$(free_port) gp=$(free_port)
    # standalone, file store, rollout printed instead of pushed, one replica (no leader
    # election): no cluster or registry needed
    "$bins/kudos-orchestrator" --config "$tmp/orchestrator.yaml" --standalone --dry-run-rollout \
      --leader-elect=false --store file --store-path "$tmp/orchestrator.redb" --http-listen "127.0.0.1:$hp" \
      --grpc-listen "127.0.0.1:$gp" >"$tmp/orchestrator.log" 2>&1 &
    opid=$!
    ready=0
    for _ in $(seq 1 120); do
      if orch_curl -f "https://127.0.0.1:$hp/readyz" >/dev/null 2>&1; then ready=1; break; fi
      kill -0 "$opid" 2>/dev/null || break
      sleep 0.25
    done
    kill "$opid" 2>/dev/null || true
    wait "$opid" 2>/dev/null || true
    opid=""
    rm -f "$tmp/orchestrator.redb"
    what="orchestrator accepts the chart's config file${v:+ (custom values)}"
    if ((ready)); then pass "$what"; else fail "$what:"$'\n'"$(tail -5 "$tmp/orchestrator.log")"; fi
  done
fi

# Step 7, run by step 6 once its kube-apiserver is up: the chart's objects stored for real;
# kube-scheduler and the orchestrator run with their own service accounts' tokens, so the chart's
# RBAC is shown to be enough: the scheduler takes its Lease with the chart's configuration, the
# orchestrator syncs its watches and becomes ready, and neither logs a refused request.
api() { curl -sf --cacert "$ca" -H "Authorization: Bearer $token" "$@"; }
sa_kubeconfig() { # sa_kubeconfig <service account> <file>
  local sa_token
  sa_token=$(api -X POST -H 'Content-Type: application/json' \
    -d '{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":3600}}' \
    "$server/api/v1/namespaces/kudos-system/serviceaccounts/$1/token" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"]["token"])') || return 1
  printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster: {server: "%s", certificate-authority: "%s"}\nusers:\n- name: %s\n  user: {token: "%s"}\ncontexts:\n- name: t\n  context: {cluster: t, user: %s}\ncurrent-context: t\n' \
    "$server" "$ca" "$1" "$sa_token" "$1" > "$2"
}
forbidden() { grep -i "forbidden" "$1" | head -3; }
run_under_chart_rbac() {
  if ! out=$(apply --for-real "$d" 2>&1); then fail "storing the default rendering:"$'\n'"$out"; return; fi
  local sched_log=$tmp/scheduler/kube-scheduler.log
  if [[ -x $bin/kube-scheduler && -x $bins/kudos-e2e-kube-scheduler ]] && sa_kubeconfig kudos-scheduler "$tmp/scheduler.kubeconfig"; then
    { tpl --show-only templates/scheduler-config.yaml | python3 -c 'import sys, yaml; print(yaml.safe_load(sys.stdin)["data"]["config.yaml"])' \
        | sed -e "s|/etc/kudos-scheduler-tls/tls\.|$tls/client.|" -e "s|/etc/kudos-scheduler-tls/ca\.crt|$tls/ca.crt|"
      printf 'clientConnection:\n  kubeconfig: %s\n' "$tmp/scheduler.kubeconfig"; } > "$tmp/scheduler.yaml"
    # Run as the test kit runs kube-scheduler, with the chart's configuration.
    "$bins/kudos-e2e-kube-scheduler" --config "$tmp/scheduler.yaml" --kubeconfig "$tmp/scheduler.kubeconfig" \
      --dir "$tmp/scheduler" >"$tmp/scheduler-runner.log" 2>&1 &
    local spid=$!
    pids+=("$spid")
    local holder=""
    for _ in $(seq 1 240); do
      kill -0 "$spid" 2>/dev/null || break
      holder=$(api "$server/apis/coordination.k8s.io/v1/namespaces/kudos-system/leases/kudos-scheduler" 2>/dev/null \
        | python3 -c 'import json, sys; print(json.load(sys.stdin)["spec"].get("holderIdentity", ""))' 2>/dev/null) && [[ -n $holder ]] && break
      sleep 0.5
    done
    if [[ -n $holder ]]; then pass "kube-scheduler with the chart's config and RBAC holds Lease kudos-scheduler"; else fail "kube-scheduler never took Lease kudos-scheduler:"$'\n'"$(head -n 1 "$tmp/scheduler-runner.log"; tail -n 15 "$sched_log" 2>&1)"; fi
    if [[ -n $(forbidden "$sched_log") ]]; then fail "kube-scheduler refused by RBAC:"$'\n'"$(forbidden "$sched_log")"; else pass "kube-scheduler logs no refused request"; fi
  else
    fail "kube-scheduler with the chart's RBAC: no $bin/kube-scheduler, no $bins/kudos-e2e-kube-scheduler or no token for kudos-scheduler"
  fi
  if [[ -x $bins/kudos-orchestrator ]] && sa_kubeconfig kudos-orchestrator "$tmp/orchestrator.kubeconfig"; then
    config_of > "$tmp/orchestrator.yaml"
    # The default chart runs two replicas with leader election: the process runs as a pod of
    # its own (a Pod object stands in for the one the Deployment would make), takes the Lease
    # and labels that pod for the Service.
    api -X POST -H 'Content-Type: application/json' \
      -d '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"kudos-orchestrator-chart-test"},"spec":{"serviceAccountName":"kudos-orchestrator","containers":[{"name":"o","image":"kudos/kudos-orchestrator"}]}}' \
      "$server/api/v1/namespaces/kudos-system/pods" >/dev/null || fail "creating the orchestrator's stand-in Pod object"
    local hp; hp=$(free_port)
    POD_NAME=kudos-orchestrator-chart-test POD_NAMESPACE=kudos-system \
    "$bins/kudos-orchestrator" --config "$tmp/orchestrator.yaml" --kubeconfig "$tmp/orchestrator.kubeconfig" \
      --http-listen "127.0.0.1:$hp" --grpc-listen "127.0.0.1:$(free_port)" >"$tmp/orchestrator-rbac.log" 2>&1 &
    opid=$!
    local ready=0 body
    for _ in $(seq 1 240); do
      # a follower answers /readyz too (it serves the extender): wait for the leader's answer
      if body=$(orch_curl -f "https://127.0.0.1:$hp/readyz" 2>/dev/null) && [[ $body != *follower* ]]; then ready=1; break; fi
      kill -0 "$opid" 2>/dev/null || break
      sleep 0.5
    done
    if ((ready)); then pass "orchestrator with the chart's config and RBAC syncs Nodes and Pods and is ready"; else fail "orchestrator under the chart's RBAC not ready:"$'\n'"$(tail -15 "$tmp/orchestrator-rbac.log")"; fi
    local role
    role=$(api "$server/api/v1/namespaces/kudos-system/pods/kudos-orchestrator-chart-test" \
      | python3 -c 'import json, sys; print(json.load(sys.stdin)["metadata"].get("labels", {}).get("kudos.dev/role", ""))')
    if [[ $role == leader ]]; then pass "the orchestrator holds Lease kudos-orchestrator and labels its pod kudos.dev/role=leader under the chart's RBAC"; else fail "the orchestrator's pod is not labelled leader (label: '$role')"; fi
    if [[ -n $(forbidden "$tmp/orchestrator-rbac.log") ]]; then fail "orchestrator refused by RBAC:"$'\n'"$(forbidden "$tmp/orchestrator-rbac.log")"; else pass "orchestrator logs no refused request"; fi
    # Reads through the real TokenReview and SubjectAccessReview with the chart's RBAC: the
    # admin (system:masters) may, kube-scheduler's ServiceAccount may not, no token gets 401;
    # the extender verbs want a client certificate, not a token.
    local code sched_token
    sched_token=$(sed -n 's/.*token: "\(.*\)"}$/\1/p' "$tmp/scheduler.kubeconfig")
    for want in "200 $token /state admin" "403 $sched_token /state kudos-scheduler" "401 - /state anonymous" "401 $token /kudos/v1/filter admin-token"; do
      read -r w t path who <<<"$want"
      local auth=(); [[ $t == - ]] || auth=(-H "Authorization: Bearer $t")
      local method=GET; [[ $path == /kudos/* ]] && method=POST
      code=$(orch_curl -o /dev/null -w '%{http_code}' -X "$method" "${auth[@]}" "https://127.0.0.1:$hp$path")
      if [[ $code == "$w" ]]; then pass "orchestrator answers $method $path as $who with $w"; else fail "orchestrator answers $method $path as $who with $code, want $w"; fi
    done
    kill "$opid" 2>/dev/null || true; wait "$opid" 2>/dev/null || true; opid=""
  else
    echo "skip  orchestrator under the chart's RBAC: no kudos-orchestrator in $bins"
  fi
}

# --- 6. server-side dry-run on a real kube-apiserver: the test kit's control plane (etcd and
# kube-apiserver with RBAC, token and service-account authentication), run by kudos-e2e-up
bin=${KUDOS_E2E_BIN_DIR:-e2e/_out/bin}
if [[ ! -x $bin/kube-apiserver || ! -x $bin/etcd || ! -x $bins/kudos-e2e-up ]]; then
  msg="no kube-apiserver/etcd in $bin (e2e/build, or set KUDOS_E2E_BIN_DIR) or no kudos-e2e-up in $bins (cargo build -p kudos-e2e)"
  if [[ ${KUDOS_E2E_REQUIRE:-} == 1 ]]; then fail "$msg"; else echo "skip  server-side dry-run: $msg"; fi
elif ! python3 -c 'import yaml' 2>/dev/null; then
  fail "server-side dry-run needs python3 with PyYAML (apt-get install python3-yaml)"
else
  KUDOS_E2E_WORK_DIR=$tmp/work "$bins/kudos-e2e-up" --nodes 0 --no-scheduler --env-file "$tmp/cluster.env" \
    >"$tmp/control-plane.log" 2>&1 &
  upid=$!
  pids+=("$upid")
  ready=0
  for _ in $(seq 1 240); do
    if [[ -f $tmp/cluster.env ]]; then ready=1; break; fi
    kill -0 "$upid" 2>/dev/null || break
    sleep 0.5
  done
  if ((ready == 0)); then
    fail "control plane (kudos-e2e-up) exited or not ready in 120 s:"$'\n'"$(tail -n 20 "$tmp/control-plane.log" "$tmp"/work/*/kube-apiserver.log 2>&1)"
  else
    # shellcheck source=/dev/null # written by kudos-e2e-up: KUDOS_UP_SERVER, _CA, _TOKEN
    source "$tmp/cluster.env"
    server=$KUDOS_UP_SERVER ca=$KUDOS_UP_CA token=$KUDOS_UP_TOKEN
    apply() { python3 charts/dry-run-apply.py --server "$server" --token "$token" --ca "$ca" "$@"; }
    # Defaults (hooks included), the custom values, and deploy/ as `kubectl apply` users get it.
    tpl -f "$tmp/custom.yaml" --set tls.mode=selfSigned > "$tmp/custom-selfsigned.yaml"
    for f in "$d" "$tmp/custom-selfsigned.yaml" deploy/manifests/00-namespace.yaml deploy/manifests/10-kudos.yaml; do
      if out=$(apply "$f" 2>&1); then pass "kube-apiserver accepts $(basename "$f") ($(tail -1 <<<"$out" | cut -d' ' -f2-))"; else fail "kube-apiserver refuses $(basename "$f"):"$'\n'"$out"; fi
    done
    # The check can fail: a misspelt field and a wrong type are refused.
    sed -e 's/^  updateStrategy:$/  updateStrategi:/' "$d" > "$tmp/typo.yaml"
    sed -e 's/^  replicas: 2$/  replicas: "two"/' "$d" > "$tmp/type.yaml"
    for f in "$tmp/typo.yaml" "$tmp/type.yaml"; do
      if out=$(apply "$f" 2>&1); then fail "kube-apiserver accepted broken $(basename "$f")"; else pass "kube-apiserver refuses broken $(basename "$f"): $(grep -m1 REFUSED <<<"$out" | cut -c1-160)"; fi
    done
    run_under_chart_rbac
  fi
fi

if ((failures > 0)); then echo "charts/test.sh: $failures failed" >&2; exit 1; fi
echo "charts/test.sh: all passed"
