# Upstream kube-scheduler (statically linked Go, built from k8s.io/kubernetes by e2e/build) for the
# real-node tests' Kudos scheduler instance: the chart runs `kube-scheduler` from PATH, as
# registry.k8s.io/kube-scheduler does. Built by images/build; nothing is pulled.
FROM scratch
COPY rootfs/ /
ENV PATH=/usr/local/bin
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kube-scheduler"]
