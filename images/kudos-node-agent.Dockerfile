# kudos-node-agent image. Built by images/build with buildah (no daemon, nothing pulled): the build
# context's rootfs/ holds the binary and exactly the shared libraries it links (found with
# ldd), so the image starts FROM scratch and carries nothing else.
# Runs as root: it reads the kubelet PodResources socket and NVML device nodes.
FROM scratch
COPY rootfs/ /
# As NVIDIA's own device-plugin image: ask the NVIDIA container toolkit for the driver's NVML
# library (utility capability) and every GPU, so the shipped manifests need no host path for it.
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility
ENTRYPOINT ["/usr/local/bin/kudos-node-agent"]
