/*
 * kudos-workload: a stand-in GPU job for the real-node e2e scenario and for trying Kudos by hand.
 *
 *   kudos-workload --class X --work 12
 *
 * It reads the devices it was given (NVIDIA_VISIBLE_DEVICES, set by the device plugin), asks
 * NVML (libnvidia-ml.so.1, mounted by the NVIDIA container toolkit) for their model, and "runs"
 * for work / speed(class, model) seconds, where speed comes from the table below: class X is
 * fastest on V100, class Y on T4. It prints one line saying what it saw and exits 0; it exits
 * 2 on bad arguments and 3 when NVML or the devices are missing.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*init_fn)(void);
typedef int (*by_uuid_fn)(const char *, void **);
typedef int (*name_fn)(void *, char *, unsigned);

/* Work units per second by (class, model substring); first match wins. */
static const struct { const char *cls, *model; double speed; } SPEED[] = {
    {"X", "V100", 3.0}, {"X", "T4", 1.0},
    {"Y", "V100", 1.0}, {"Y", "T4", 3.0},
    {"", "", 1.5}, /* any other class or model */
};

static double speed(const char *cls, const char *model) {
    for (size_t i = 0; i < sizeof SPEED / sizeof SPEED[0]; i++) {
        if ((!SPEED[i].cls[0] || !strcmp(cls, SPEED[i].cls)) &&
            (!SPEED[i].model[0] || strstr(model, SPEED[i].model)))
            return SPEED[i].speed;
    }
    return 1.0;
}

int main(int argc, char **argv) {
    const char *cls = NULL;
    double work = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--class")) cls = argv[i + 1];
        else if (!strcmp(argv[i], "--work")) work = strtod(argv[i + 1], NULL);
    }
    if (!cls || !(work >= 0 && work <= 86400)) {
        fprintf(stderr, "usage: kudos-workload --class NAME --work UNITS (0..86400)\n");
        return 2;
    }
    const char *visible = getenv("NVIDIA_VISIBLE_DEVICES");
    if (!visible || !*visible) {
        fprintf(stderr, "kudos-workload: NVIDIA_VISIBLE_DEVICES is not set: no devices given\n");
        return 3;
    }
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "kudos-workload: cannot load libnvidia-ml.so.1: %s\n", dlerror());
        return 3;
    }
    init_fn init = (init_fn)dlsym(lib, "nvmlInit_v2");
    by_uuid_fn by_uuid = (by_uuid_fn)dlsym(lib, "nvmlDeviceGetHandleByUUID");
    name_fn get_name = (name_fn)dlsym(lib, "nvmlDeviceGetName");
    if (!init || !by_uuid || !get_name || init() != 0) {
        fprintf(stderr, "kudos-workload: NVML does not initialise\n");
        return 3;
    }
    /* The slowest device given sets the pace (a data-parallel job waits for its slowest GPU). */
    char list[4096], model[96] = "", slowest[96] = "";
    double s = 0;
    int n = 0;
    snprintf(list, sizeof list, "%s", visible);
    for (char *save = NULL, *uuid = strtok_r(list, ",", &save); uuid; uuid = strtok_r(NULL, ",", &save)) {
        void *dev = NULL;
        if (by_uuid(uuid, &dev) != 0 || get_name(dev, model, sizeof model) != 0) {
            fprintf(stderr, "kudos-workload: NVML does not know device %s\n", uuid);
            return 3;
        }
        double d = speed(cls, model);
        if (n == 0 || d < s) { s = d; snprintf(slowest, sizeof slowest, "%s", model); }
        n++;
    }
    double seconds = work / s;
    printf("kudos-workload: class=%s devices=%d model=%s speed=%.2f work=%.1f seconds=%.2f\n",
           cls, n, slowest, s, work, seconds);
    fflush(stdout);
    struct timespec t = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&t, &t) != 0) {}
    return 0;
}
