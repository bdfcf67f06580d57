# kudos-orchestrator image. Built by images/build with buildah (no daemon, nothing pulled): the build
# context's rootfs/ holds the binary and exactly the shared libraries it links (found with
# ldd), so the image starts FROM scratch and carries nothing else.
# Needs no privilege: runs as an unprivileged numeric user.
FROM scratch
COPY rootfs/ /
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kudos-orchestrator"]
