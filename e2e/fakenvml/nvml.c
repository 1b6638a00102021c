/*
 * A fake libnvidia-ml.so.1: the part of the NVML C API that nvidia-ml-py (our plugin's inventory and XID
 * watch), github.com/NVIDIA/go-nvml (which dlopens this library and resolves the versioned symbols such as
 * nvmlInit_v2 at load time) and the reference device plugin's gpu-monitoring-tools bindings (which dlopen it
 * RTLD_GLOBAL and leave their calls to the dynamic loader, resolved lazily) call, answering for GPUs described by
 * an environment variable.
 *
 * It models the real library's contract as nvml.h (go-nvml v0.13.4-1, pkg/nvml/nvml.h) states it: reference
 * counted init/shutdown, NVML_ERROR_UNINITIALIZED before init, NVML_ERROR_INVALID_ARGUMENT for a bad index,
 * handle or NULL pointer, NVML_ERROR_INSUFFICIENT_SIZE for short buffers, the struct layouts of nvmlMemory_t,
 * nvmlMemory_v2_t (with its version word), nvmlPciInfo_t and nvmlEventData_t, and event sets whose wait
 * returns NVML_ERROR_TIMEOUT when nothing happened. The return codes for the arguments its tests use, the error
 * strings, the supported event mask and the memory reservation were checked against the driver's library on an H200.
 *
 *   GPUSHARE_FAKE_NVML_GPUS    COUNTxMiB (e.g. 4x16384), or a comma list of MiB[:UUID[:MINOR]] where MINOR is
 *                              a number or "-" for a GPU without a device node (nvmlDeviceGetMinorNumber then
 *                              answers NVML_ERROR_NOT_SUPPORTED). Unset: nvmlInit answers DRIVER_NOT_LOADED,
 *                              as on a machine without the driver. UUIDs not given are derived from the index.
 *   GPUSHARE_FAKE_NVML_EVENTS  a file the event-set wait polls: each appended line "<index or UUID> <xid>" is
 *                              an XID critical error on that GPU, delivered to every event set registered for
 *                              XIDs on it that existed when the line was written.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4, NVML_ERROR_ALREADY_INITIALIZED = 5, NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12, NVML_ERROR_FUNCTION_NOT_FOUND = 13, NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_MEMORY = 20, NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25, NVML_ERROR_UNKNOWN = 999,
};

#define EVENT_XID 0x8ULL
/* What an H200's driver library reports: ECC, P-state, XID, clock, power source, MIG, ECC storm, DRAM
 * retirement, poison, unavailable and recovery-action events. */
#define SUPPORTED_EVENTS 0xff9fULL
#define NO_INSTANCE 0xFFFFFFFFu /* gpuInstanceId/computeInstanceId outside MIG */
#define MAX_GPUS 64
#define DEVICE_MAGIC 0x6e766d6cu
#define SET_MAGIC 0x65767473u
#define POLL_NS 10000000L /* how often a waiting event set looks at the events file: 10 ms */

struct nvmlDevice_st {
    unsigned magic;
    unsigned index;
    unsigned long long memory_bytes;
    int minor; /* -1: no device node */
    char uuid[96];
};
typedef struct nvmlDevice_st *nvmlDevice_t;

struct nvmlEventSet_st {
    unsigned magic;
    long offset; /* bytes of the events file already seen by this set */
    unsigned long long registered[MAX_GPUS];
};
typedef struct nvmlEventSet_st *nvmlEventSet_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refcount;
static unsigned gpu_count;
static struct nvmlDevice_st gpus[MAX_GPUS];

static const char DRIVER_VERSION[] = "550.127.05";
static const char NVML_VERSION[] = "12.550.127.05";
static const char GPU_NAME[] = "gpushare fake GPU";

/* splitmix64: a fixed, well-mixed sequence, so derived UUIDs look like real ones and never change. */
static unsigned long long mix(unsigned long long x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static void derived_uuid(unsigned index, char *out, size_t size) {
    unsigned long long a = mix(0x67707573686172ULL + index), b = mix(a);
    snprintf(out, size, "GPU-%08llx-%04llx-%04llx-%04llx-%012llx", a >> 32, (a >> 16) & 0xffff, a & 0xffff,
             b >> 48, b & 0xffffffffffffULL);
}

static int parse_uint(const char *text, const char *end, unsigned long long *value) {
    char *stop;
    if (text == end || *text < '0' || *text > '9') return 0;
    errno = 0;
    *value = strtoull(text, &stop, 10);
    return errno == 0 && stop == end;
}

static int add_gpu(unsigned long long mib, const char *uuid, size_t uuid_len, long minor) {
    struct nvmlDevice_st *gpu;
    if (gpu_count >= MAX_GPUS || mib == 0 || uuid_len >= sizeof(gpu->uuid)) return 0;
    gpu = &gpus[gpu_count];
    gpu->magic = DEVICE_MAGIC;
    gpu->index = gpu_count;
    gpu->memory_bytes = mib << 20;
    gpu->minor = (int)minor;
    if (uuid_len) {
        memcpy(gpu->uuid, uuid, uuid_len);
        gpu->uuid[uuid_len] = '\0';
    } else {
        derived_uuid(gpu_count, gpu->uuid, sizeof(gpu->uuid));
    }
    gpu_count++;
    return 1;
}

/* One list entry MiB[:UUID[:MINOR]], between start and end. */
static int parse_entry(const char *start, const char *end) {
    const char *colon = memchr(start, ':', (size_t)(end - start)), *uuid = NULL, *uuid_end = NULL;
    unsigned long long mib, minor_value;
    long minor = gpu_count;
    if (!parse_uint(start, colon ? colon : end, &mib)) return 0;
    if (colon) {
        uuid = colon + 1;
        uuid_end = memchr(uuid, ':', (size_t)(end - uuid));
        if (uuid_end) {
            if (end - uuid_end == 2 && uuid_end[1] == '-') minor = -1;
            else if (parse_uint(uuid_end + 1, end, &minor_value) && minor_value < 1u << 20) minor = (long)minor_value;
            else return 0;
        } else {
            uuid_end = end;
        }
        if (uuid_end - uuid < 5 || strncmp(uuid, "GPU-", 4) != 0) return 0;
    }
    return add_gpu(mib, uuid, uuid ? (size_t)(uuid_end - uuid) : 0, minor);
}

static nvmlReturn_t load_gpus(void) {
    const char *spec = getenv("GPUSHARE_FAKE_NVML_GPUS"), *x, *start, *end;
    unsigned long long count, mib;
    gpu_count = 0;
    if (spec == NULL || *spec == '\0') return NVML_ERROR_DRIVER_NOT_LOADED;
    x = strchr(spec, 'x');
    if (x && parse_uint(spec, x, &count) && parse_uint(x + 1, spec + strlen(spec), &mib) && count <= MAX_GPUS) {
        for (unsigned i = 0; i < count; i++)
            if (!add_gpu(mib, NULL, 0, i)) goto bad;
        return NVML_SUCCESS;
    }
    for (start = spec;; start = end + 1) {
        end = strchr(start, ',');
        if (end == NULL) end = start + strlen(start);
        if (!parse_entry(start, end)) goto bad;
        if (*end == '\0') return NVML_SUCCESS;
    }
bad:
    fprintf(stderr, "fake NVML: GPUSHARE_FAKE_NVML_GPUS=%s is not COUNTxMiB (e.g. 4x16384) nor a comma list of "
            "MiB[:GPU-UUID[:MINOR|-]] of at most %d GPUs; fix the variable\n", spec, MAX_GPUS);
    gpu_count = 0;
    return NVML_ERROR_UNKNOWN;
}

static int initialised(void) {
    pthread_mutex_lock(&lock);
    int ok = refcount > 0;
    pthread_mutex_unlock(&lock);
    return ok;
}

/* NVML_SUCCESS when the library is initialised and device is one of its handles. */
static nvmlReturn_t check_device(nvmlDevice_t device) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || device < gpus || device >= gpus + gpu_count || device->magic != DEVICE_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

/* The driver keeps a little memory for itself (615 MiB of an H200's 143771 MiB): about 1/234 of it. */
static unsigned long long reserved(const struct nvmlDevice_st *device) { return device->memory_bytes / 234; }

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length) {
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    nvmlReturn_t result = NVML_SUCCESS;
    (void)flags;
    pthread_mutex_lock(&lock);
    if (refcount == 0) result = load_gpus();
    if (result == NVML_SUCCESS) refcount++;
    pthread_mutex_unlock(&lock);
    return result;
}
EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t result = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (refcount == 0) result = NVML_ERROR_UNINITIALIZED;
    else refcount--;
    pthread_mutex_unlock(&lock);
    return result;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return initialised() ? copy_text(DRIVER_VERSION, version, length) : NVML_ERROR_UNINITIALIZED;
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return copy_text(NVML_VERSION, version, length); /* the one query the real library answers before init */
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (version == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *version = 12040;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = gpu_count;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    if (uuid == NULL || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < gpu_count; i++) {
        if (strcmp(gpus[i].uuid, uuid) == 0) {
            *device = &gpus[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (index == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *index = device->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t result = check_device(device);
    return result != NVML_SUCCESS ? result : copy_text(device->uuid, uuid, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t result = check_device(device);
    return result != NVML_SUCCESS ? result : copy_text(GPU_NAME, name, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = device->memory_bytes;
    memory->used = reserved(device); /* v1 counts the driver's reservation as used, as the real library does */
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    /* The real library answers an unknown structure version with FUNCTION_NOT_FOUND, not VERSION_MISMATCH. */
    if (memory->version != NVML_MEMORY_V2) return NVML_ERROR_FUNCTION_NOT_FOUND;
    memory->total = device->memory_bytes;
    memory->reserved = reserved(device);
    memory->used = 0; /* nothing runs on a fake GPU */
    memory->free = memory->total - memory->reserved;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (minor == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->minor < 0) return NVML_ERROR_NOT_SUPPORTED;
    *minor = (unsigned int)device->minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (pci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    pci->bus = 0x18 + device->index; /* one GPU per bus, as on a typical 8-GPU board */
    pci->pciDeviceId = 0x233510de;     /* NVIDIA's vendor id 0x10de in the low half */
    pci->pciSubSystemId = 0x18d610de;
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", 0u, pci->bus, 0u);
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.0", 0u, pci->bus, 0u);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }

/* -- what a fake GPU does not support ---------------------------------------------------------------------- */
/* Queries the reference device plugin's NVML bindings make for every GPU at start-up (gpu-monitoring-tools,
 * NewDevice): answered as the real library answers a GPU without the feature, after the same argument checks.
 * The bindings read NOT_SUPPORTED as "unknown" and go on. */

typedef struct { unsigned long long bar1Total, bar1Free, bar1Used; } nvmlBAR1Memory_t;
enum { NVML_CLOCK_COUNT = 4 }; /* nvmlClockType_t: GRAPHICS, SM, MEM, VIDEO */

static nvmlReturn_t unsupported(nvmlDevice_t device, const void *out) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit) {
    return unsupported(device, limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1) {
    return unsupported(device, bar1);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *generation) {
    return unsupported(device, generation);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *width) {
    return unsupported(device, width);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (type < 0 || type >= NVML_CLOCK_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    return unsupported(device, clock);
}

/* -- events ------------------------------------------------------------------------------------------------ */

static long events_size(void) {
    const char *path = getenv("GPUSHARE_FAKE_NVML_EVENTS");
    FILE *file = path ? fopen(path, "r") : NULL;
    long size = 0;
    if (file) {
        if (fseek(file, 0, SEEK_END) == 0) size = ftell(file);
        fclose(file);
    }
    return size < 0 ? 0 : size;
}

static int valid_set(nvmlEventSet_t set) { return set != NULL && set->magic == SET_MAGIC; }

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    struct nvmlEventSet_st *created;
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    created = calloc(1, sizeof(*created));
    if (created == NULL) return NVML_ERROR_MEMORY;
    created->magic = SET_MAGIC;
    created->offset = events_size(); /* a set sees only what happens after it exists */
    *set = created;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    if (!valid_set(set)) return NVML_ERROR_INVALID_ARGUMENT;
    set->magic = 0;
    free(set);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (types == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *types = SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (!valid_set(set)) return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~SUPPORTED_EVENTS) return NVML_ERROR_NOT_SUPPORTED;
    set->registered[device->index] |= types;
    return NVML_SUCCESS;
}

/* The GPU a line of the events file names (an index or a UUID), or NULL. */
static struct nvmlDevice_st *named_gpu(const char *name) {
    unsigned long long index;
    if (parse_uint(name, name + strlen(name), &index)) return index < gpu_count ? &gpus[index] : NULL;
    for (unsigned i = 0; i < gpu_count; i++)
        if (strcmp(gpus[i].uuid, name) == 0) return &gpus[i];
    return NULL;
}

/* Reads the set's unseen complete lines; fills data and returns 1 at the first XID for a registered GPU. */
static int next_event(nvmlEventSet_t set, nvmlEventData_t *data) {
    const char *path = getenv("GPUSHARE_FAKE_NVML_EVENTS");
    char line[256], name[128];
    unsigned long long xid;
    int found = 0;
    FILE *file = path ? fopen(path, "r") : NULL;
    if (file == NULL || fseek(file, set->offset, SEEK_SET) != 0) {
        if (file) fclose(file);
        return 0;
    }
    while (!found && fgets(line, sizeof(line), file) != NULL) {
        size_t length = strlen(line);
        if (length == 0 || line[length - 1] != '\n') break; /* a line still being written: read it next time */
        set->offset += (long)length;
        if (sscanf(line, "%127s %llu", name, &xid) != 2) continue;
        struct nvmlDevice_st *gpu = named_gpu(name);
        if (gpu == NULL || !(set->registered[gpu->index] & EVENT_XID)) continue;
        data->device = gpu;
        data->eventType = EVENT_XID;
        data->eventData = xid;
        data->gpuInstanceId = data->computeInstanceId = NO_INSTANCE;
        found = 1;
    }
    fclose(file);
    return found;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    struct timespec start, now, pause = {0, POLL_NS};
    if (!initialised()) return NVML_ERROR_UNINITIALIZED;
    if (!valid_set(set) || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        if (next_event(set, data)) return NVML_SUCCESS;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long waited_ms = (now.tv_sec - start.tv_sec) * 1000LL + (now.tv_nsec - start.tv_nsec) / 1000000LL;
        if (waited_ms >= (long long)timeoutms) return NVML_ERROR_TIMEOUT;
        nanosleep(&pause, NULL);
    }
}

/* The v1 wait fills the same leading fields; the instance ids are left alone as in the v1 structure. */
EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    nvmlEventData_t full;
    nvmlReturn_t result;
    if (data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    result = nvmlEventSetWait_v2(set, &full, timeoutms);
    if (result == NVML_SUCCESS) {
        data->device = full.device;
        data->eventType = full.eventType;
        data->eventData = full.eventData;
    }
    return result;
}
