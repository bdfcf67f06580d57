{{/* Names are fixed (one Kudos per cluster): the orchestrator's allowed users, the rollout's
     service account and DaemonSet names refer to them. */}}

{{- define "kudos.labels" -}}
app.kubernetes.io/part-of: kudos
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* A Kudos image: kudos.image (list $ .Values.<component>.image) */}}
{{- define "kudos.image" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- $tag := $root.Values.image.tag | default $root.Chart.AppVersion -}}
{{- if $root.Values.image.registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $root.Values.image.registry) $img.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $img.repository $tag -}}
{{- end -}}
{{- end }}

{{/* The cluster's version as an upstream image tag: v1.30.5-eks-1234 -> v1.30.5. */}}
{{- define "kudos.kubeTag" -}}
{{- regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- end }}

{{/* An upstream Kubernetes image: kudos.upstreamImage (list $ .Values.scheduler.image) */}}
{{- define "kudos.upstreamImage" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $img.registry) $img.repository ($img.tag | default (include "kudos.kubeTag" $root)) -}}
{{- end }}

{{- define "kudos.pullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kudos.orchestratorHost" -}}
{{ printf "kudos-orchestrator.%s.svc" .Release.Namespace }}
{{- end }}

{{/* Host of the extender: with several replicas, the Service of all of them (followers answer
     the extender too); with one, the orchestrator's own. */}}
{{- define "kudos.extenderHost" -}}
{{- if gt (int .Values.orchestrator.replicas) 1 -}}
{{ printf "kudos-orchestrator-extender.%s.svc" .Release.Namespace }}
{{- else -}}
{{ include "kudos.orchestratorHost" . }}
{{- end }}
{{- end }}

{{/* gRPC address given to the device plugin and node agent. */}}
{{- define "kudos.orchestratorGrpc" -}}
{{ printf "%s://%s:%v" (ternary "http" "https" (eq .Values.tls.mode "none")) (include "kudos.orchestratorHost" .) .Values.orchestrator.ports.grpc }}
{{- end }}

{{/* Extender URL prefix for kube-scheduler. */}}
{{- define "kudos.extenderURL" -}}
{{ printf "%s://%s:%v%s" (ternary "http" "https" (eq .Values.tls.mode "none")) (include "kudos.extenderHost" .) .Values.orchestrator.ports.http (trimSuffix "/" .Values.orchestrator.extender.pathPrefix) }}
{{- end }}

{{/* Short-lived token for the orchestrator only (audience kudos-orchestrator); the orchestrator
     checks it with a TokenReview. Rotated by the kubelet; both binaries re-read it. */}}
{{- define "kudos.tokenVolume" -}}
- name: kudos-token
  projected:
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3600
          audience: kudos-orchestrator
{{- end }}

{{/* NVML access for the plugin and agent: env, mounts, volumes, runtime class. */}}
{{- define "kudos.nvidiaEnv" -}}
- name: NVIDIA_VISIBLE_DEVICES
  value: {{ .Values.nvidia.visibleDevices | quote }}
- name: NVIDIA_DRIVER_CAPABILITIES
  value: {{ .Values.nvidia.driverCapabilities | quote }}
{{- if .Values.nvidia.driverLibraryDir }}
- name: KUDOS_NVML_LIBRARY
  value: /run/kudos/nvml-lib/libnvidia-ml.so.1
{{- end }}
{{- end }}

{{- define "kudos.nvidiaMounts" -}}
{{- if .Values.nvidia.driverLibraryDir }}
- name: nvml-lib
  mountPath: /run/kudos/nvml-lib
  readOnly: true
{{- end }}
{{- if .Values.nvidia.devDir }}
- name: dev
  mountPath: /dev
  readOnly: true
{{- end }}
{{- end }}

{{- define "kudos.nvidiaVolumes" -}}
{{- if .Values.nvidia.driverLibraryDir }}
- name: nvml-lib
  hostPath:
    path: {{ .Values.nvidia.driverLibraryDir }}
    type: Directory
{{- end }}
{{- if .Values.nvidia.devDir }}
- name: dev
  hostPath:
    path: {{ .Values.nvidia.devDir }}
    type: Directory
{{- end }}
{{- end }}

{{/* Secret with kube-scheduler's client certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "kudos.schedulerClientSecretName" -}}
{{- if eq .Values.tls.mode "existingSecret" -}}
{{ required "tls.existingClientSecret is required with tls.mode existingSecret (kube-scheduler's client certificate, DNS name kudos-scheduler)" .Values.tls.existingClientSecret }}
{{- else -}}
kudos-scheduler-client-tls
{{- end -}}
{{- end }}

{{- define "kudos.tlsSecretName" -}}
{{- if eq .Values.tls.mode "existingSecret" -}}
{{ .Values.tls.existingSecret }}
{{- else -}}
kudos-orchestrator-tls
{{- end -}}
{{- end }}

{{/* The orchestrator's CA for the gRPC clients (device plugin, node agent): a ConfigMap, so
     the nodes never get the Secret that holds the orchestrator's key. */}}
{{- define "kudos.caArgs" -}}
{{- if ne .Values.tls.mode "none" }}
- --orchestrator-ca-file=/etc/kudos-ca/ca.crt
{{- end }}
{{- end }}
{{- define "kudos.caMount" -}}
{{- if ne .Values.tls.mode "none" }}
- {name: kudos-ca, mountPath: /etc/kudos-ca, readOnly: true}
{{- end }}
{{- end }}
{{- define "kudos.caVolume" -}}
{{- if ne .Values.tls.mode "none" }}
- name: kudos-ca
  configMap: {name: kudos-orchestrator-ca}
{{- end }}
{{- end }}
