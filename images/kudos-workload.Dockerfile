# Example GPU job (examples/workload): reads NVIDIA_VISIBLE_DEVICES, asks NVML for the model and
# runs for work / speed(class, model) seconds. FROM scratch with the glibc it links; the NVIDIA
# container toolkit mounts libnvidia-ml.so.1 at run time. Built by images/build.
FROM scratch
COPY rootfs/ /
ENTRYPOINT ["/usr/local/bin/kudos-workload"]
