# Pod sandbox (pause) image for the real-node e2e nodes: a static 10-line C program
# (images/pause/pause.c), FROM scratch. Built by images/build.
FROM scratch
COPY rootfs/ /
ENTRYPOINT ["/pause"]
