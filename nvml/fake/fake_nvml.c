/*
 * fake_nvml.c: a stand-in for libnvidia-ml.so.1, for tests on machines without an NVIDIA GPU.
 *
 * Tests load it through the real nvml-wrapper code path (`Nvml::builder().lib_path(..)`), so the
 * Rust layer above it is exercised exactly as on a GPU node. The fake reads its state from the
 * file named by $KUDOS_FAKE_NVML_CONFIG or, when that is unset, from `fake-nvml.conf` beside the
 * loaded library file. A copy of the library in its own directory is a separate instance (the
 * dynamic loader shares state only per file), so each test gets its own fake. The file is
 * re-read whenever it changes (inode, size or mtime), so a test rewrites it (atomically, by
 * rename) to change samples, inject XID events or make NVML fail.
 *
 * File format: one record per line, `kind: key=value; key=value; ...`; `#` starts a comment.
 *   nvml: fail=<code>            every call (init included) returns NVML error <code>
 *   nvml: driver=<version>
 *   device: uuid=GPU-..; name=..; memory=<bytes>; memused=<bytes>; pci=0000:3b:00.0; minor=0;
 *           numa=<n or -1>; util=<%>; memutil=<%>; power=<mW>; sm_clock=<MHz>; temp=<C>;
 *           energy=<mJ>; fail=<code>; cc=<major>.<minor>
 *           (fail: every query on this device returns <code>; cc: CUDA compute capability,
 *           absent: not supported)
 *   process: device=<index>; pid=<n>; mem=<bytes>; sm=<%>; memutil=<%>
 *   link: a=<index>; b=<index>; level=<0|10|20|30|40|50>; nvlinks=<n>
 *   xid: device=<index>; value=<xid>
 * Devices are indexed in file order. XID records are delivered in order through
 * nvmlEventSetWait_v2 to every event set that registered for the device; a set only sees XID
 * records appended after it registered, so tests append `xid:` lines to inject events.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define MAX_DEV 64
#define MAX_PROC 256
#define MAX_LINK 256
#define MAX_XID 4096
#define MAX_SETS 64

typedef int nvmlReturn_t;
enum {
    OK = 0, E_UNINIT = 1, E_INVALID = 2, E_NOT_SUPPORTED = 3, E_NOT_FOUND = 6,
    E_INSUFFICIENT = 7, E_TIMEOUT = 10, E_GPU_LOST = 15, E_UNKNOWN = 999
};

typedef struct {
    char uuid[96], name[96], pci[32];
    unsigned long long memory, memused, energy;
    int minor, numa, fail, cc_major, cc_minor;
    unsigned util, memutil, power, sm_clock, temp;
} dev_t_;

typedef struct { int dev; unsigned pid, sm, memutil; unsigned long long mem; } proc_t_;
typedef struct { int a, b, level, nvlinks; } link_t_;
typedef struct { int dev; unsigned long long value; } xid_t_;

typedef struct {
    int used;
    unsigned long long mask[MAX_DEV];
    int next_xid;
} set_t_;

typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gi, ci; } nvmlProcessInfo_t;
typedef struct {
    unsigned pid; unsigned long long timeStamp; unsigned smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef struct {
    void *device; unsigned long long eventType, eventData; unsigned gi, ci;
} nvmlEventData_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static dev_t_ devs[MAX_DEV];
static int ndev;
static proc_t_ procs[MAX_PROC];
static int nproc;
static link_t_ links[MAX_LINK];
static int nlink;
static xid_t_ xids[MAX_XID];
static int nxid;
static set_t_ sets[MAX_SETS];
static int global_fail;
static int initialized;
static char driver[80] = "550.54.15";
static struct stat last_st;
static int have_st;

static void trim(char **s) {
    while (**s == ' ' || **s == '\t') (*s)++;
    char *e = *s + strlen(*s);
    while (e > *s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) *--e = 0;
}

static void set_field(const char *kind, const char *k, const char *v, int *fields) {
    unsigned long long n = strtoull(v, NULL, 0);
    long long sn = strtoll(v, NULL, 0);
    if (!strcmp(kind, "nvml")) {
        if (!strcmp(k, "fail")) global_fail = (int)sn;
        else if (!strcmp(k, "driver")) snprintf(driver, sizeof driver, "%s", v);
    } else if (!strcmp(kind, "device")) {
        dev_t_ *d = &devs[ndev];
        if (!strcmp(k, "uuid")) snprintf(d->uuid, sizeof d->uuid, "%s", v);
        else if (!strcmp(k, "name")) snprintf(d->name, sizeof d->name, "%s", v);
        else if (!strcmp(k, "pci")) snprintf(d->pci, sizeof d->pci, "%s", v);
        else if (!strcmp(k, "memory")) d->memory = n;
        else if (!strcmp(k, "memused")) d->memused = n;
        else if (!strcmp(k, "energy")) d->energy = n;
        else if (!strcmp(k, "minor")) d->minor = (int)sn;
        else if (!strcmp(k, "numa")) d->numa = (int)sn;
        else if (!strcmp(k, "cc")) {
            const char *dot = strchr(v, '.');
            d->cc_major = atoi(v);
            d->cc_minor = dot ? atoi(dot + 1) : 0;
        }
        else if (!strcmp(k, "fail")) d->fail = (int)sn;
        else if (!strcmp(k, "util")) d->util = (unsigned)n;
        else if (!strcmp(k, "memutil")) d->memutil = (unsigned)n;
        else if (!strcmp(k, "power")) d->power = (unsigned)n;
        else if (!strcmp(k, "sm_clock")) d->sm_clock = (unsigned)n;
        else if (!strcmp(k, "temp")) d->temp = (unsigned)n;
    } else if (!strcmp(kind, "process")) {
        proc_t_ *p = &procs[nproc];
        if (!strcmp(k, "device")) p->dev = (int)sn;
        else if (!strcmp(k, "pid")) p->pid = (unsigned)n;
        else if (!strcmp(k, "mem")) p->mem = n;
        else if (!strcmp(k, "sm")) p->sm = (unsigned)n;
        else if (!strcmp(k, "memutil")) p->memutil = (unsigned)n;
    } else if (!strcmp(kind, "link")) {
        link_t_ *l = &links[nlink];
        if (!strcmp(k, "a")) l->a = (int)sn;
        else if (!strcmp(k, "b")) l->b = (int)sn;
        else if (!strcmp(k, "level")) l->level = (int)sn;
        else if (!strcmp(k, "nvlinks")) l->nvlinks = (int)sn;
    } else if (!strcmp(kind, "xid")) {
        xid_t_ *x = &xids[nxid];
        if (!strcmp(k, "device")) x->dev = (int)sn;
        else if (!strcmp(k, "value")) x->value = n;
    }
    (*fields)++;
}

/* Re-reads the configuration when the file changed. Called with `mu` held. */
static void reload(void) {
    static char beside[4096];
    const char *path = getenv("KUDOS_FAKE_NVML_CONFIG");
    if (!path || !*path) {
        if (!beside[0]) {
            Dl_info info;
            if (!dladdr((void *)&reload, &info) || !info.dli_fname) return;
            const char *slash = strrchr(info.dli_fname, '/');
            int dir = slash ? (int)(slash - info.dli_fname) : 1;
            snprintf(beside, sizeof beside, "%.*s/fake-nvml.conf", dir, slash ? info.dli_fname : ".");
        }
        path = beside;
    }
    struct stat st;
    if (stat(path, &st) != 0) return;
    if (have_st && st.st_ino == last_st.st_ino && st.st_size == last_st.st_size &&
        st.st_mtim.tv_sec == last_st.st_mtim.tv_sec && st.st_mtim.tv_nsec == last_st.st_mtim.tv_nsec)
        return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    last_st = st;
    have_st = 1;
    ndev = nproc = nlink = nxid = 0;
    global_fail = 0;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *colon = strchr(line, ':');
        if (!colon) continue;
        *colon = 0;
        char *kind = line, *rest = colon + 1;
        trim(&kind);
        if (!strcmp(kind, "device")) {
            if (ndev >= MAX_DEV) continue;
            memset(&devs[ndev], 0, sizeof devs[ndev]);
            devs[ndev].numa = -1;
            devs[ndev].minor = ndev;
        } else if (!strcmp(kind, "process")) {
            if (nproc >= MAX_PROC) continue;
            memset(&procs[nproc], 0, sizeof procs[nproc]);
        } else if (!strcmp(kind, "link")) {
            if (nlink >= MAX_LINK) continue;
            memset(&links[nlink], 0, sizeof links[nlink]);
        } else if (!strcmp(kind, "xid")) {
            if (nxid >= MAX_XID) continue;
            memset(&xids[nxid], 0, sizeof xids[nxid]);
        }
        int fields = 0;
        char *save = NULL;
        for (char *kv = strtok_r(rest, ";", &save); kv; kv = strtok_r(NULL, ";", &save)) {
            char *eq = strchr(kv, '=');
            if (!eq) continue;
            *eq = 0;
            char *k = kv, *v = eq + 1;
            trim(&k);
            trim(&v);
            set_field(kind, k, v, &fields);
        }
        if (!strcmp(kind, "device")) ndev++;
        else if (!strcmp(kind, "process")) nproc++;
        else if (!strcmp(kind, "link")) nlink++;
        else if (!strcmp(kind, "xid")) nxid++;
    }
    fclose(f);
}

/* Takes the lock, refreshes the configuration and checks the global failure switch. */
static nvmlReturn_t enter(void) {
    pthread_mutex_lock(&mu);
    reload();
    if (global_fail) return global_fail;
    if (!initialized) return E_UNINIT;
    return OK;
}
#define ENTER()                                   \
    do {                                          \
        nvmlReturn_t r_ = enter();                \
        if (r_ != OK) { pthread_mutex_unlock(&mu); return r_; } \
    } while (0)
#define RETURN(v) do { nvmlReturn_t rv_ = (v); pthread_mutex_unlock(&mu); return rv_; } while (0)

/* Resolves a handle to a device index; -1 when stale. Called with `mu` held. */
static int dev_index(void *h) {
    if ((dev_t_ *)h < devs || (dev_t_ *)h >= devs + ndev) return -1;
    return (int)((dev_t_ *)h - devs);
}
#define DEVICE(h, i)                                  \
    int i = dev_index(h);                             \
    if (i < 0) RETURN(E_INVALID);                     \
    if (devs[i].fail) RETURN(devs[i].fail)

static nvmlReturn_t copy_str(char *dst, unsigned len, const char *src) {
    if (!dst) return E_INVALID;
    if (strlen(src) + 1 > len) return E_INSUFFICIENT;
    strcpy(dst, src);
    return OK;
}

/* === library === */

nvmlReturn_t nvmlInit_v2(void) {
    pthread_mutex_lock(&mu);
    reload();
    if (global_fail) RETURN(global_fail);
    initialized++;
    RETURN(OK);
}
nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; return nvmlInit_v2(); }
nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&mu);
    if (initialized > 0) initialized--;
    RETURN(OK);
}
const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK: return "Success";
    case E_UNINIT: return "Uninitialized";
    case E_NOT_SUPPORTED: return "Not Supported";
    case E_TIMEOUT: return "Timeout";
    case E_GPU_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned len) { ENTER(); RETURN(copy_str(v, len, driver)); }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned len) { ENTER(); RETURN(copy_str(v, len, "12.550.54.15")); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { ENTER(); if (!v) RETURN(E_INVALID); *v = 12040; RETURN(OK); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return nvmlSystemGetCudaDriverVersion_v2(v); }

/* === devices === */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { ENTER(); if (!n) RETURN(E_INVALID); *n = (unsigned)ndev; RETURN(OK); }
nvmlReturn_t nvmlDeviceGetCount(unsigned *n) { return nvmlDeviceGetCount_v2(n); }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
    ENTER();
    if (!h || i >= (unsigned)ndev) RETURN(E_INVALID);
    *h = &devs[i];
    RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned i, void **h) { return nvmlDeviceGetHandleByIndex_v2(i, h); }
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **h) {
    ENTER();
    if (!uuid || !h) RETURN(E_INVALID);
    for (int i = 0; i < ndev; i++)
        if (!strcmp(devs[i].uuid, uuid)) { *h = &devs[i]; RETURN(OK); }
    RETURN(E_NOT_FOUND);
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pci, void **h) {
    ENTER();
    if (!pci || !h) RETURN(E_INVALID);
    for (int i = 0; i < ndev; i++)
        if (!strcasecmp(devs[i].pci, pci)) { *h = &devs[i]; RETURN(OK); }
    RETURN(E_NOT_FOUND);
}
nvmlReturn_t nvmlDeviceGetIndex(void *h, unsigned *v) { ENTER(); DEVICE(h, i); if (!v) RETURN(E_INVALID); *v = (unsigned)i; RETURN(OK); }
nvmlReturn_t nvmlDeviceGetUUID(void *h, char *v, unsigned len) { ENTER(); DEVICE(h, i); RETURN(copy_str(v, len, devs[i].uuid)); }
nvmlReturn_t nvmlDeviceGetName(void *h, char *v, unsigned len) { ENTER(); DEVICE(h, i); RETURN(copy_str(v, len, devs[i].name)); }
nvmlReturn_t nvmlDeviceGetMinorNumber(void *h, unsigned *v) { ENTER(); DEVICE(h, i); if (!v) RETURN(E_INVALID); *v = (unsigned)devs[i].minor; RETURN(OK); }
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) {
    ENTER(); DEVICE(h, i);
    if (!major || !minor) RETURN(E_INVALID);
    if (devs[i].cc_major <= 0) RETURN(E_NOT_SUPPORTED);
    *major = devs[i].cc_major;
    *minor = devs[i].cc_minor;
    RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetNumaNodeId(void *h, unsigned *v) {
    ENTER(); DEVICE(h, i);
    if (!v) RETURN(E_INVALID);
    if (devs[i].numa < 0) RETURN(E_NOT_SUPPORTED);
    *v = (unsigned)devs[i].numa;
    RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *h, nvmlMemory_v2_t *m) {
    ENTER(); DEVICE(h, i);
    if (!m) RETURN(E_INVALID);
    m->total = devs[i].memory;
    m->reserved = 0;
    m->used = devs[i].memused;
    m->free = devs[i].memory > devs[i].memused ? devs[i].memory - devs[i].memused : 0;
    RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(void *h, nvmlMemory_t *m) {
    ENTER(); DEVICE(h, i);
    if (!m) RETURN(E_INVALID);
    m->total = devs[i].memory;
    m->used = devs[i].memused;
    m->free = devs[i].memory > devs[i].memused ? devs[i].memory - devs[i].memused : 0;
    RETURN(OK);
}
static void fill_pci(nvmlPciInfo_t *p, const char *bus_id) {
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%s", bus_id);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%s", bus_id);
    unsigned dom = 0, bus = 0, dev = 0, fn = 0;
    sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn);
    p->domain = dom;
    p->bus = bus;
    p->device = dev;
    p->pciDeviceId = 0x233010de;
    p->pciSubSystemId = 0x16c110de;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *h, nvmlPciInfo_t *p) { ENTER(); DEVICE(h, i); if (!p) RETURN(E_INVALID); fill_pci(p, devs[i].pci); RETURN(OK); }
nvmlReturn_t nvmlDeviceGetPciInfo_v2(void *h, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(h, p); }
nvmlReturn_t nvmlDeviceGetUtilizationRates(void *h, nvmlUtilization_t *u) {
    ENTER(); DEVICE(h, i);
    if (!u) RETURN(E_INVALID);
    u->gpu = devs[i].util;
    u->memory = devs[i].memutil;
    RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetPowerUsage(void *h, unsigned *v) { ENTER(); DEVICE(h, i); if (!v) RETURN(E_INVALID); *v = devs[i].power; RETURN(OK); }
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(void *h, unsigned long long *v) { ENTER(); DEVICE(h, i); if (!v) RETURN(E_INVALID); *v = devs[i].energy; RETURN(OK); }
nvmlReturn_t nvmlDeviceGetClockInfo(void *h, int type, unsigned *v) {
    ENTER(); DEVICE(h, i);
    if (!v) RETURN(E_INVALID);
    *v = (type == 1 || type == 0) ? devs[i].sm_clock : 0; /* NVML_CLOCK_GRAPHICS=0, SM=1 */
    RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetTemperature(void *h, int sensor, unsigned *v) {
    ENTER(); DEVICE(h, i);
    if (!v || sensor != 0) RETURN(E_INVALID);
    *v = devs[i].temp;
    RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *count, nvmlProcessInfo_t *out) {
    ENTER(); DEVICE(h, i);
    if (!count) RETURN(E_INVALID);
    unsigned n = 0;
    for (int p = 0; p < nproc; p++) if (procs[p].dev == i) n++;
    if (!out || *count < n) { *count = n; RETURN(n == 0 ? OK : E_INSUFFICIENT); }
    unsigned k = 0;
    for (int p = 0; p < nproc; p++)
        if (procs[p].dev == i) {
            out[k].pid = procs[p].pid;
            out[k].usedGpuMemory = procs[p].mem;
            out[k].gi = out[k].ci = 0xFFFFFFFFu;
            k++;
        }
    *count = k;
    RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetProcessUtilization(void *h, nvmlProcessUtilizationSample_t *out, unsigned *count,
                                             unsigned long long last_seen) {
    (void)last_seen;
    ENTER(); DEVICE(h, i);
    if (!count) RETURN(E_INVALID);
    unsigned n = 0;
    for (int p = 0; p < nproc; p++) if (procs[p].dev == i) n++;
    if (!out || *count < n) { *count = n; RETURN(n == 0 ? OK : E_INSUFFICIENT); }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned k = 0;
    for (int p = 0; p < nproc; p++)
        if (procs[p].dev == i) {
            memset(&out[k], 0, sizeof out[k]);
            out[k].pid = procs[p].pid;
            out[k].timeStamp = (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000ull;
            out[k].smUtil = procs[p].sm;
            out[k].memUtil = procs[p].memutil;
            k++;
        }
    *count = k;
    RETURN(OK);
}

/* === topology === */

static link_t_ *find_link(int a, int b) {
    for (int l = 0; l < nlink; l++)
        if ((links[l].a == a && links[l].b == b) || (links[l].a == b && links[l].b == a)) return &links[l];
    return NULL;
}
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(void *h1, void *h2, int *level) {
    ENTER(); DEVICE(h1, a); DEVICE(h2, b);
    if (!level) RETURN(E_INVALID);
    link_t_ *l = find_link(a, b);
    if (a == b) *level = 0;
    else if (l && l->level) *level = l->level;
    else *level = (devs[a].numa >= 0 && devs[a].numa == devs[b].numa) ? 40 : 50;
    RETURN(OK);
}
/* Device i's NVLinks are numbered over its link records in file order. */
static int nvlink_peer(int i, unsigned link) {
    unsigned base = 0;
    for (int l = 0; l < nlink; l++) {
        int peer = links[l].a == i ? links[l].b : links[l].b == i ? links[l].a : -1;
        if (peer < 0 || links[l].nvlinks <= 0) continue;
        if (link < base + (unsigned)links[l].nvlinks) return peer;
        base += (unsigned)links[l].nvlinks;
    }
    return -1;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(void *h, unsigned link, int *active) {
    ENTER(); DEVICE(h, i);
    if (!active) RETURN(E_INVALID);
    if (link >= 18) RETURN(E_INVALID);
    *active = nvlink_peer(i, link) >= 0;
    RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(void *h, unsigned link, nvmlPciInfo_t *p) {
    ENTER(); DEVICE(h, i);
    if (!p || link >= 18) RETURN(E_INVALID);
    int peer = nvlink_peer(i, link);
    if (peer < 0 || peer >= ndev) RETURN(E_NOT_SUPPORTED);
    fill_pci(p, devs[peer].pci);
    RETURN(OK);
}

/* === events === */

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *h, unsigned long long *types) {
    ENTER(); DEVICE(h, i);
    if (!types) RETURN(E_INVALID);
    *types = 8; /* nvmlEventTypeXidCriticalError */
    RETURN(OK);
}
nvmlReturn_t nvmlEventSetCreate(void **set) {
    ENTER();
    if (!set) RETURN(E_INVALID);
    for (int s = 0; s < MAX_SETS; s++)
        if (!sets[s].used) {
            memset(&sets[s], 0, sizeof sets[s]);
            sets[s].used = 1;
            sets[s].next_xid = nxid;
            *set = &sets[s];
            RETURN(OK);
        }
    RETURN(E_UNKNOWN);
}
static set_t_ *set_of(void *s) {
    set_t_ *p = (set_t_ *)s;
    if (p < sets || p >= sets + MAX_SETS || !p->used) return NULL;
    return p;
}
nvmlReturn_t nvmlDeviceRegisterEvents(void *h, unsigned long long types, void *set) {
    ENTER(); DEVICE(h, i);
    set_t_ *s = set_of(set);
    if (!s) RETURN(E_INVALID);
    if (types & ~8ull) RETURN(E_NOT_SUPPORTED);
    s->mask[i] |= types;
    s->next_xid = nxid; /* only events after registration */
    RETURN(OK);
}
nvmlReturn_t nvmlEventSetFree(void *set) {
    pthread_mutex_lock(&mu);
    set_t_ *s = set_of(set);
    if (s) s->used = 0;
    RETURN(OK);
}
nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned timeout_ms) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        ENTER();
        set_t_ *s = set_of(set);
        if (!s || !data) RETURN(E_INVALID);
        if (s->next_xid > nxid) s->next_xid = nxid; /* the file was rewritten shorter */
        while (s->next_xid < nxid) {
            xid_t_ *x = &xids[s->next_xid++];
            if (x->dev < 0 || x->dev >= ndev || !(s->mask[x->dev] & 8ull)) continue;
            memset(data, 0, sizeof *data);
            data->device = &devs[x->dev];
            data->eventType = 8;
            data->eventData = x->value;
            RETURN(OK);
        }
        pthread_mutex_unlock(&mu);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long waited = (now.tv_sec - start.tv_sec) * 1000ll + (now.tv_nsec - start.tv_nsec) / 1000000ll;
        if (waited >= (long long)timeout_ms) return E_TIMEOUT;
        struct timespec nap = {0, 5 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}
nvmlReturn_t nvmlEventSetWait(void *set, nvmlEventData_t *data, unsigned timeout_ms) {
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}
