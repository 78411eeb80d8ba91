/*
 * fakenvml: a fake libnvidia-ml.so.1 for the lab, driven by a JSON hardware profile.
 *
 * Unmodified pynvml (nvidia-ml-py) loads it by SONAME and must see the profile's machine exactly:
 * values, NOT_SUPPORTED where the real card would answer so, and the real call protocols
 * (UNINITIALIZED before init, ref-counted init/shutdown, INSUFFICIENT_SIZE with the needed count).
 * Signatures and struct layouts follow nvml.h as summarised in docs/facts/nvml.md §1.5-§1.6.
 *
 * Environment:
 *   FAKE_NVML_PROFILE      profile path (default /etc/fake-nvml/profile.json), read at init
 *   FAKE_NVML_UTILIZATION  per-GPU utilisation overrides (default /run/fake-nvml/utilization.json),
 *                          read on every nvmlDeviceGetUtilizationRates call
 *
 * Never writes to stdout: an Ansible module's JSON goes there (docs/facts/nvml.md §0.7).
 * Diagnostics go to stderr, one line each.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define API __attribute__((visibility("default")))

/* nvmlReturn_t values (docs/facts/nvml.md §1.3) */
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_ALREADY_INITIALIZED 5
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_LIBRARY_NOT_FOUND 12
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu
#define NVML_NVLINK_MAX_LINKS 36
#define NVML_NVLINK_CAP_COUNT 6
#define NVML_P2P_CAPS_INDEX_COUNT 5 /* READ WRITE NVLINK ATOMICS PCI */
#define NVML_P2P_STATUS_NOT_SUPPORTED 5
#define NVML_NVLINK_DEVICE_TYPE_GPU 0
#define NVML_NVLINK_DEVICE_TYPE_SWITCH 2
#define NVML_NVLINK_DEVICE_TYPE_UNKNOWN 0xFF
#define NVML_MEMORY_V2_VERSION 0x02000028u    /* sizeof(nvmlMemory_v2_t) | 2 << 24 */
#define NVML_TEMPERATURE_V1_VERSION 0x0100000Cu /* sizeof(nvmlTemperature_t) | 1 << 24 */

#define MAX_CPUS 1024
#define MASK_WORDS (MAX_CPUS / 64)
#define MAX_NUMA_NODES 64

typedef int nvmlReturn_t;
typedef struct fake_gpu *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

typedef struct {
    unsigned int version;
    unsigned int sensorType;
    int temperature;
} nvmlTemperature_t;

struct fake_link {
    int active;
    char remote_bus_id[32];
    unsigned int remote_device_type;
    unsigned int version;
};

struct fake_process {
    unsigned int pid;
    unsigned long long used_memory_bytes;
    char name[256];
};

struct fake_page {
    unsigned long long address;
    unsigned long long timestamp;
};

struct fake_gpu {
    unsigned int index;
    char name[96];
    char uuid[96];
    char serial[32];
    char bus_id[32];
    unsigned int domain, bus, device;
    unsigned int pci_device_id, pci_subsystem_id;
    unsigned int minor_number;
    unsigned long long memory_total, memory_used, memory_reserved;
    int cc_major, cc_minor;
    unsigned int architecture;
    unsigned int brand;
    unsigned int pcie_max_gen, pcie_max_width, pcie_cur_gen, pcie_cur_width;
    unsigned long long cpu_mask[MASK_WORDS];
    int numa_node;   /* nearest NUMA node: MemoryAffinity, i.e. nvidia-smi's "NUMA Affinity" */
    int gpu_numa_id; /* nvmlDeviceGetNumaNodeId; -1 = NOT_SUPPORTED (every x86 host) */
    unsigned int power_limit_mw, power_default_limit_mw, power_min_limit_mw, power_max_limit_mw;
    unsigned int power_usage_mw;
    int persistence_mode;
    unsigned int temperature_c;
    unsigned int util_gpu, util_memory;
    int has_ecc;
    int ecc_current, ecc_pending;
    unsigned long long ecc_counts[2][2]; /* [nvmlMemoryErrorType_t][nvmlEccCounterType_t] */
    int has_retired_pages;
    unsigned int n_pages[2]; /* [nvmlPageRetirementCause_t] */
    struct fake_page *pages[2];
    int retired_pending;
    int has_remapped_rows;
    unsigned int remap_correctable, remap_uncorrectable;
    int remap_pending, remap_failure;
    int has_mig;
    int mig_current, mig_pending;
    int has_nvlink;
    unsigned int n_links;
    struct fake_link links[NVML_NVLINK_MAX_LINKS];
    unsigned int n_processes;
    struct fake_process *processes;
};

struct fake_machine {
    char profile_path[4096];
    char driver_version[80];
    char nvml_version[80];
    int cuda_driver_version;
    unsigned int n_gpus;
    struct fake_gpu *gpus;
    unsigned int *common_ancestor;           /* n*n */
    unsigned int *p2p[NVML_P2P_CAPS_INDEX_COUNT]; /* n*n each */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int g_refcount;
static struct fake_machine *g_machine;
static int g_utilization_warned;

/* ------------------------------------------------------------------------------------------------ */
/* Profile loading. Every problem becomes one message naming the file and the JSON path at fault.    */

struct loader {
    const char *file;
    char error[1024];
};

static int fail(struct loader *ld, const char *fmt, ...)
{
    char detail[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    snprintf(ld->error, sizeof ld->error, "GPU profile %s: %s", ld->file, detail);
    return -1;
}

static json_t *member(json_t *obj, const char *key)
{
    return json_is_object(obj) ? json_object_get(obj, key) : NULL;
}

static int need_int(struct loader *ld, json_t *obj, const char *path, const char *key, long long lo,
                    long long hi, long long *out)
{
    json_t *v = member(obj, key);
    if (!v)
        return fail(ld, "%s.%s: missing (expected an integer)", path, key);
    if (!json_is_integer(v))
        return fail(ld, "%s.%s: expected an integer", path, key);
    *out = json_integer_value(v);
    if (*out < lo || *out > hi)
        return fail(ld, "%s.%s: %lld is out of range %lld..%lld", path, key, *out, lo, hi);
    return 0;
}

static int opt_int(struct loader *ld, json_t *obj, const char *path, const char *key, long long lo,
                   long long hi, long long dflt, long long *out)
{
    if (!member(obj, key) || json_is_null(member(obj, key))) {
        *out = dflt;
        return 0;
    }
    return need_int(ld, obj, path, key, lo, hi, out);
}

static int need_uint(struct loader *ld, json_t *obj, const char *path, const char *key,
                     unsigned int *out)
{
    long long v;
    if (need_int(ld, obj, path, key, 0, 0xFFFFFFFFLL, &v))
        return -1;
    *out = (unsigned int)v;
    return 0;
}

static int need_u64(struct loader *ld, json_t *obj, const char *path, const char *key,
                    unsigned long long *out)
{
    long long v;
    if (need_int(ld, obj, path, key, 0, LLONG_MAX, &v))
        return -1;
    *out = (unsigned long long)v;
    return 0;
}

static int need_bool(struct loader *ld, json_t *obj, const char *path, const char *key, int *out)
{
    json_t *v = member(obj, key);
    if (!v)
        return fail(ld, "%s.%s: missing (expected true or false)", path, key);
    if (!json_is_boolean(v))
        return fail(ld, "%s.%s: expected true or false", path, key);
    *out = json_is_true(v);
    return 0;
}

static int need_str(struct loader *ld, json_t *obj, const char *path, const char *key, char *out,
                    size_t size)
{
    json_t *v = member(obj, key);
    if (!v)
        return fail(ld, "%s.%s: missing (expected a string)", path, key);
    if (!json_is_string(v))
        return fail(ld, "%s.%s: expected a string", path, key);
    if (json_string_length(v) + 1 > size)
        return fail(ld, "%s.%s: longer than %zu characters", path, key, size - 1);
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return 0;
}

/* An object member that may be null (the feature is NOT_SUPPORTED on this card). */
static int nullable_obj(struct loader *ld, json_t *obj, const char *path, const char *key,
                        json_t **out)
{
    json_t *v = member(obj, key);
    if (!v)
        return fail(ld, "%s.%s: missing (expected an object, or null for NOT_SUPPORTED)", path, key);
    if (json_is_null(v)) {
        *out = NULL;
        return 0;
    }
    if (!json_is_object(v))
        return fail(ld, "%s.%s: expected an object, or null for NOT_SUPPORTED", path, key);
    *out = v;
    return 0;
}

static int need_obj(struct loader *ld, json_t *obj, const char *path, const char *key, json_t **out)
{
    json_t *v = member(obj, key);
    if (!v || !json_is_object(v))
        return fail(ld, "%s.%s: %s", path, key, v ? "expected an object" : "missing (expected an object)");
    *out = v;
    return 0;
}

static int parse_hex_u32(struct loader *ld, json_t *obj, const char *path, const char *key,
                         unsigned int *out)
{
    char text[32];
    char *end;
    unsigned long v;
    if (need_str(ld, obj, path, key, text, sizeof text))
        return -1;
    errno = 0;
    v = strtoul(text, &end, 16);
    if (errno || *end || end == text || v > 0xFFFFFFFFul || strncasecmp(text, "0x", 2) != 0)
        return fail(ld, "%s.%s: \"%s\" is not a 32-bit hex value like \"0x1DB610DE\"", path, key, text);
    *out = (unsigned int)v;
    return 0;
}

/* "00000000:1A:00.0" -> domain, bus, device; the canonical form nvmlPciInfo_t.busId carries. */
static int parse_bus_id(const char *text, unsigned int *domain, unsigned int *bus, unsigned int *device)
{
    unsigned int d, b, dev, fn;
    char tail;
    if (sscanf(text, "%8x:%2x:%2x.%1x%c", &d, &b, &dev, &fn, &tail) != 4)
        return -1;
    if (strlen(text) != 16)
        return -1;
    *domain = d;
    *bus = b;
    *device = dev;
    return 0;
}

/* CPU lists as nvidia-smi prints them: "0-19,40-59". */
static int parse_cpu_list(const char *text, unsigned long long *mask, unsigned int max)
{
    const char *p = text;
    memset(mask, 0, MASK_WORDS * sizeof *mask);
    if (!*p)
        return -1;
    while (*p) {
        char *end;
        unsigned long lo, hi;
        if (*p < '0' || *p > '9')
            return -1;
        lo = strtoul(p, &end, 10);
        hi = lo;
        p = end;
        if (*p == '-') {
            p++;
            if (*p < '0' || *p > '9')
                return -1;
            hi = strtoul(p, &end, 10);
            p = end;
        }
        if (hi < lo || hi >= max)
            return -1;
        for (unsigned long c = lo; c <= hi; c++)
            mask[c / 64] |= 1ULL << (c % 64);
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return 0;
}

struct name_code {
    const char *name;
    unsigned int code;
};

static const struct name_code architectures[] = {
    {"kepler", 2}, {"maxwell", 3}, {"pascal", 4}, {"volta", 5}, {"turing", 6},
    {"ampere", 7}, {"ada", 8}, {"hopper", 9}, {"blackwell", 10}, {NULL, 0},
};

/* nvmlBrandType_t; a profile names the brand the way `nvidia-smi -q` prints "Product Brand". */
static const struct name_code brands[] = {
    {"Quadro", 1}, {"Tesla", 2}, {"NVS", 3}, {"GeForce", 5}, {"Titan", 6},
    {"Quadro RTX", 12}, {"NVIDIA RTX", 13}, {"NVIDIA", 14}, {NULL, 0},
};

static const struct name_code device_types[] = {
    {"gpu", NVML_NVLINK_DEVICE_TYPE_GPU}, {"switch", NVML_NVLINK_DEVICE_TYPE_SWITCH}, {NULL, 0},
};

static int need_name(struct loader *ld, json_t *obj, const char *path, const char *key,
                     const struct name_code *table, unsigned int *out)
{
    char text[64];
    char known[256] = "";
    if (need_str(ld, obj, path, key, text, sizeof text))
        return -1;
    for (const struct name_code *e = table; e->name; e++) {
        if (strcmp(e->name, text) == 0) {
            *out = e->code;
            return 0;
        }
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s\"%s\"", known[0] ? ", " : "", e->name);
    }
    return fail(ld, "%s.%s: unknown value \"%s\" (known: %s)", path, key, text, known);
}

static int load_ecc(struct loader *ld, json_t *gj, const char *path, struct fake_gpu *g)
{
    json_t *ecc = NULL, *errors = NULL, *kind = NULL;
    static const char *const kinds[2] = {"corrected", "uncorrected"};
    char sub[128];
    if (nullable_obj(ld, gj, path, "ecc", &ecc))
        return -1;
    g->has_ecc = ecc != NULL;
    if (!ecc)
        return 0;
    snprintf(sub, sizeof sub, "%s.ecc", path);
    if (need_bool(ld, ecc, sub, "current", &g->ecc_current) || need_bool(ld, ecc, sub, "pending", &g->ecc_pending))
        return -1;
    if (need_obj(ld, ecc, sub, "errors", &errors))
        return -1;
    for (int t = 0; t < 2; t++) {
        char kpath[160];
        snprintf(kpath, sizeof kpath, "%s.ecc.errors", path);
        if (need_obj(ld, errors, kpath, kinds[t], &kind))
            return -1;
        snprintf(kpath, sizeof kpath, "%s.ecc.errors.%s", path, kinds[t]);
        if (need_u64(ld, kind, kpath, "volatile", &g->ecc_counts[t][0]) ||
            need_u64(ld, kind, kpath, "aggregate", &g->ecc_counts[t][1]))
            return -1;
    }
    return 0;
}

static int load_pages(struct loader *ld, json_t *rp, const char *path, const char *key, int cause,
                      struct fake_gpu *g)
{
    json_t *list = member(rp, key);
    size_t i;
    json_t *item;
    if (!list || !json_is_array(list))
        return fail(ld, "%s.%s: expected a list of page addresses", path, key);
    g->n_pages[cause] = (unsigned int)json_array_size(list);
    g->pages[cause] = calloc(g->n_pages[cause] + 1, sizeof(struct fake_page));
    if (!g->pages[cause])
        return fail(ld, "out of memory");
    json_array_foreach(list, i, item) {
        char ipath[160];
        snprintf(ipath, sizeof ipath, "%s.%s[%zu]", path, key, i);
        if (json_is_integer(item) && json_integer_value(item) >= 0) {
            g->pages[cause][i].address = (unsigned long long)json_integer_value(item);
        } else if (json_is_object(item)) {
            if (need_u64(ld, item, ipath, "address", &g->pages[cause][i].address) ||
                need_u64(ld, item, ipath, "timestamp", &g->pages[cause][i].timestamp))
                return -1;
        } else {
            return fail(ld, "%s: expected a page address (integer) or {address, timestamp}", ipath);
        }
    }
    return 0;
}

static int load_gpu(struct loader *ld, json_t *gj, unsigned int index, struct fake_gpu *g)
{
    char path[64], sub[128];
    long long v;
    json_t *cc, *pcie = NULL, *util = NULL, *obj = NULL, *list, *item;
    size_t i;
    char text[256];

    snprintf(path, sizeof path, "gpus[%u]", index);
    if (!json_is_object(gj))
        return fail(ld, "%s: expected an object", path);
    g->index = index;
    if (need_str(ld, gj, path, "name", g->name, sizeof g->name) ||
        need_str(ld, gj, path, "uuid", g->uuid, sizeof g->uuid) ||
        need_str(ld, gj, path, "serial", g->serial, sizeof g->serial) ||
        need_str(ld, gj, path, "pci_bus_id", g->bus_id, sizeof g->bus_id))
        return -1;
    if (parse_bus_id(g->bus_id, &g->domain, &g->bus, &g->device))
        return fail(ld, "%s.pci_bus_id: \"%s\" is not a bus id like \"00000000:1A:00.0\"", path, g->bus_id);
    if (parse_hex_u32(ld, gj, path, "pci_device_id", &g->pci_device_id) ||
        parse_hex_u32(ld, gj, path, "pci_subsystem_id", &g->pci_subsystem_id) ||
        need_uint(ld, gj, path, "minor_number", &g->minor_number) ||
        need_u64(ld, gj, path, "memory_total_bytes", &g->memory_total) ||
        need_u64(ld, gj, path, "memory_used_bytes", &g->memory_used))
        return -1;
    if (opt_int(ld, gj, path, "memory_reserved_bytes", 0, LLONG_MAX, 0, &v))
        return -1;
    g->memory_reserved = (unsigned long long)v;
    if (g->memory_used > g->memory_total || g->memory_reserved > g->memory_used)
        return fail(ld, "%s: need memory_reserved_bytes <= memory_used_bytes <= memory_total_bytes", path);

    cc = member(gj, "compute_capability");
    if (!json_is_array(cc) || json_array_size(cc) != 2 || !json_is_integer(json_array_get(cc, 0)) ||
        !json_is_integer(json_array_get(cc, 1)))
        return fail(ld, "%s.compute_capability: expected [major, minor], e.g. [7, 0]", path);
    g->cc_major = (int)json_integer_value(json_array_get(cc, 0));
    g->cc_minor = (int)json_integer_value(json_array_get(cc, 1));
    if (need_name(ld, gj, path, "architecture", architectures, &g->architecture) ||
        need_name(ld, gj, path, "brand", brands, &g->brand))
        return -1;

    snprintf(sub, sizeof sub, "%s.pcie", path);
    if (need_obj(ld, gj, path, "pcie", &pcie) ||
        need_uint(ld, pcie, sub, "max_gen", &g->pcie_max_gen) ||
        need_uint(ld, pcie, sub, "max_width", &g->pcie_max_width) ||
        need_uint(ld, pcie, sub, "cur_gen", &g->pcie_cur_gen) ||
        need_uint(ld, pcie, sub, "cur_width", &g->pcie_cur_width))
        return -1;

    if (need_str(ld, gj, path, "cpu_affinity", text, sizeof text))
        return -1;
    if (parse_cpu_list(text, g->cpu_mask, MAX_CPUS))
        return fail(ld, "%s.cpu_affinity: \"%s\" is not a CPU list like \"0-19,40-59\" (CPUs < %d)", path, text, MAX_CPUS);
    if (need_int(ld, gj, path, "numa_node", 0, MAX_NUMA_NODES - 1, &v))
        return -1;
    g->numa_node = (int)v;
    if (opt_int(ld, gj, path, "gpu_numa_id", 0, 0x7FFFFFFF, -1, &v))
        return -1;
    g->gpu_numa_id = (int)v;

    if (need_uint(ld, gj, path, "power_limit_mw", &g->power_limit_mw))
        return -1;
    if (opt_int(ld, gj, path, "power_default_limit_mw", 0, 0xFFFFFFFFLL, g->power_limit_mw, &v))
        return -1;
    g->power_default_limit_mw = (unsigned int)v;
    if (opt_int(ld, gj, path, "power_min_limit_mw", 0, 0xFFFFFFFFLL, g->power_default_limit_mw / 2, &v))
        return -1;
    g->power_min_limit_mw = (unsigned int)v;
    if (opt_int(ld, gj, path, "power_max_limit_mw", 0, 0xFFFFFFFFLL, g->power_default_limit_mw, &v))
        return -1;
    g->power_max_limit_mw = (unsigned int)v;
    if (opt_int(ld, gj, path, "power_usage_mw", 0, 0xFFFFFFFFLL, g->power_limit_mw / 10, &v))
        return -1;
    g->power_usage_mw = (unsigned int)v;
    if (need_bool(ld, gj, path, "persistence_mode", &g->persistence_mode) ||
        need_uint(ld, gj, path, "temperature_c", &g->temperature_c))
        return -1;
    snprintf(sub, sizeof sub, "%s.utilization", path);
    if (need_obj(ld, gj, path, "utilization", &util) || need_uint(ld, util, sub, "gpu", &g->util_gpu) ||
        need_uint(ld, util, sub, "memory", &g->util_memory))
        return -1;

    if (load_ecc(ld, gj, path, g))
        return -1;

    if (nullable_obj(ld, gj, path, "retired_pages", &obj))
        return -1;
    g->has_retired_pages = obj != NULL;
    if (obj) {
        snprintf(sub, sizeof sub, "%s.retired_pages", path);
        /* nvmlPageRetirementCause_t: MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0, DOUBLE_BIT_ECC_ERROR = 1 */
        if (load_pages(ld, obj, sub, "single_bit", 0, g) || load_pages(ld, obj, sub, "double_bit", 1, g) ||
            need_bool(ld, obj, sub, "pending", &g->retired_pending))
            return -1;
    }

    if (nullable_obj(ld, gj, path, "remapped_rows", &obj))
        return -1;
    g->has_remapped_rows = obj != NULL;
    if (obj) {
        snprintf(sub, sizeof sub, "%s.remapped_rows", path);
        if (need_uint(ld, obj, sub, "correctable", &g->remap_correctable) ||
            need_uint(ld, obj, sub, "uncorrectable", &g->remap_uncorrectable) ||
            need_bool(ld, obj, sub, "pending", &g->remap_pending) ||
            need_bool(ld, obj, sub, "failure", &g->remap_failure))
            return -1;
    }

    if (nullable_obj(ld, gj, path, "mig_mode", &obj))
        return -1;
    g->has_mig = obj != NULL;
    if (obj) {
        snprintf(sub, sizeof sub, "%s.mig_mode", path);
        if (need_bool(ld, obj, sub, "current", &g->mig_current) ||
            need_bool(ld, obj, sub, "pending", &g->mig_pending))
            return -1;
    }

    list = member(gj, "nvlink");
    if (!list)
        return fail(ld, "%s.nvlink: missing (expected a list of links, or null for NOT_SUPPORTED)", path);
    g->has_nvlink = !json_is_null(list);
    if (g->has_nvlink) {
        if (!json_is_array(list) || json_array_size(list) > NVML_NVLINK_MAX_LINKS)
            return fail(ld, "%s.nvlink: expected a list of at most %d links, or null", path, NVML_NVLINK_MAX_LINKS);
        g->n_links = (unsigned int)json_array_size(list);
        json_array_foreach(list, i, item) {
            struct fake_link *l = &g->links[i];
            unsigned int bus_domain, bus_bus, bus_dev;
            snprintf(sub, sizeof sub, "%s.nvlink[%zu]", path, i);
            if (need_int(ld, item, sub, "link", (long long)i, (long long)i, &v))
                return fail(ld, "%s.link: links must be listed in order 0, 1, 2, ...", sub);
            if (need_bool(ld, item, sub, "state", &l->active) ||
                need_str(ld, item, sub, "remote_bus_id", l->remote_bus_id, sizeof l->remote_bus_id))
                return -1;
            if (parse_bus_id(l->remote_bus_id, &bus_domain, &bus_bus, &bus_dev))
                return fail(ld, "%s.remote_bus_id: \"%s\" is not a bus id like \"00000000:1A:00.0\"", sub, l->remote_bus_id);
            l->remote_device_type = NVML_NVLINK_DEVICE_TYPE_GPU;
            if (member(item, "remote_device_type") &&
                need_name(ld, item, sub, "remote_device_type", device_types, &l->remote_device_type))
                return -1;
            if (opt_int(ld, item, sub, "version", 1, 10, 2, &v))
                return -1;
            l->version = (unsigned int)v;
        }
    }

    list = member(gj, "processes");
    if (!list || !json_is_array(list))
        return fail(ld, "%s.processes: expected a list (empty when the GPU is idle)", path);
    g->n_processes = (unsigned int)json_array_size(list);
    g->processes = calloc(g->n_processes + 1, sizeof(struct fake_process));
    if (!g->processes)
        return fail(ld, "out of memory");
    json_array_foreach(list, i, item) {
        struct fake_process *p = &g->processes[i];
        snprintf(sub, sizeof sub, "%s.processes[%zu]", path, i);
        if (need_uint(ld, item, sub, "pid", &p->pid) ||
            need_u64(ld, item, sub, "used_memory_bytes", &p->used_memory_bytes) ||
            need_str(ld, item, sub, "name", p->name, sizeof p->name))
            return -1;
    }
    return 0;
}

static int load_matrix(struct loader *ld, json_t *parent, const char *path, const char *key,
                       unsigned int n, unsigned int **out)
{
    json_t *rows = member(parent, key);
    *out = calloc((size_t)n * n + 1, sizeof(unsigned int));
    if (!*out)
        return fail(ld, "out of memory");
    if (!json_is_array(rows) || json_array_size(rows) != n)
        return fail(ld, "%s.%s: expected a %ux%u matrix (one row per GPU)", path, key, n, n);
    for (unsigned int i = 0; i < n; i++) {
        json_t *row = json_array_get(rows, i);
        if (!json_is_array(row) || json_array_size(row) != n)
            return fail(ld, "%s.%s[%u]: expected a row of %u integers", path, key, i, n);
        for (unsigned int j = 0; j < n; j++) {
            json_t *cell = json_array_get(row, j);
            if (!json_is_integer(cell) || json_integer_value(cell) < 0)
                return fail(ld, "%s.%s[%u][%u]: expected a non-negative integer", path, key, i, j);
            (*out)[i * n + j] = (unsigned int)json_integer_value(cell);
        }
    }
    return 0;
}

static void free_machine(struct fake_machine *m)
{
    if (!m)
        return;
    for (unsigned int i = 0; m->gpus && i < m->n_gpus; i++) {
        free(m->gpus[i].processes);
        free(m->gpus[i].pages[0]);
        free(m->gpus[i].pages[1]);
    }
    free(m->gpus);
    free(m->common_ancestor);
    for (int k = 0; k < NVML_P2P_CAPS_INDEX_COUNT; k++)
        free(m->p2p[k]);
    free(m);
}

static const char *profile_path(void)
{
    const char *p = getenv("FAKE_NVML_PROFILE");
    return (p && *p) ? p : "/etc/fake-nvml/profile.json";
}

static struct fake_machine *load_machine(struct loader *ld)
{
    static const char *const p2p_keys[NVML_P2P_CAPS_INDEX_COUNT] = {"read", "write", "nvlink", "atomics", "pci"};
    json_error_t jerr;
    json_t *root, *gpus, *topology = NULL, *p2p = NULL;
    struct fake_machine *m;
    FILE *f;
    long long v;

    ld->file = profile_path();
    f = fopen(ld->file, "r");
    if (!f) {
        snprintf(ld->error, sizeof ld->error,
                 "cannot read GPU profile %s: %s (set FAKE_NVML_PROFILE to a lab/profiles/*.json file)",
                 ld->file, strerror(errno));
        return NULL;
    }
    root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    fclose(f);
    if (!root) {
        snprintf(ld->error, sizeof ld->error, "GPU profile %s is not valid JSON: %s at line %d column %d",
                 ld->file, jerr.text, jerr.line, jerr.column);
        return NULL;
    }
    m = calloc(1, sizeof *m);
    if (!m) {
        json_decref(root);
        fail(ld, "out of memory");
        return NULL;
    }
    snprintf(m->profile_path, sizeof m->profile_path, "%s", ld->file);
    if (!json_is_object(root)) {
        fail(ld, "top level: expected an object");
        goto bad;
    }
    if (need_str(ld, root, "profile", "driver_version", m->driver_version, sizeof m->driver_version) ||
        need_str(ld, root, "profile", "nvml_version", m->nvml_version, sizeof m->nvml_version) ||
        need_int(ld, root, "profile", "cuda_driver_version", 1000, 99990, &v))
        goto bad;
    m->cuda_driver_version = (int)v;
    gpus = member(root, "gpus");
    if (!json_is_array(gpus)) {
        fail(ld, "gpus: expected a list of GPU objects");
        goto bad;
    }
    m->n_gpus = (unsigned int)json_array_size(gpus);
    m->gpus = calloc(m->n_gpus + 1, sizeof(struct fake_gpu));
    if (!m->gpus) {
        fail(ld, "out of memory");
        goto bad;
    }
    for (unsigned int i = 0; i < m->n_gpus; i++)
        if (load_gpu(ld, json_array_get(gpus, i), i, &m->gpus[i]))
            goto bad;
    for (unsigned int i = 0; i < m->n_gpus; i++)
        for (unsigned int j = 0; j < i; j++)
            if (strcasecmp(m->gpus[i].bus_id, m->gpus[j].bus_id) == 0 || strcmp(m->gpus[i].uuid, m->gpus[j].uuid) == 0) {
                fail(ld, "gpus[%u] and gpus[%u] share a pci_bus_id or uuid", j, i);
                goto bad;
            }
    if (need_obj(ld, root, "profile", "topology", &topology) ||
        load_matrix(ld, topology, "topology", "common_ancestor", m->n_gpus, &m->common_ancestor))
        goto bad;
    if (need_obj(ld, root, "profile", "p2p", &p2p))
        goto bad;
    for (int k = 0; k < NVML_P2P_CAPS_INDEX_COUNT; k++)
        if (load_matrix(ld, p2p, "p2p", p2p_keys[k], m->n_gpus, &m->p2p[k]))
            goto bad;
    json_decref(root);
    return m;
bad:
    json_decref(root);
    free_machine(m);
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* Library lifetime                                                                                  */

static nvmlReturn_t do_init(void)
{
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) {
        struct loader ld = {0};
        g_machine = load_machine(&ld);
        if (!g_machine) {
            fprintf(stderr, "fakenvml: %s\n", ld.error);
            ret = NVML_ERROR_UNKNOWN;
        }
    }
    if (ret == NVML_SUCCESS)
        g_refcount++;
    pthread_mutex_unlock(&g_lock);
    return ret;
}

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* NO_GPUS / NO_ATTACH change nothing for a profile that always has its GPUs */
    return do_init();
}

API nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
API nvmlReturn_t nvmlInit(void) { return do_init(); }

API nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else if (--g_refcount == 0) {
        free_machine(g_machine);
        g_machine = NULL;
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

/* Not part of NVML: lets the probe say `simulated: true` honestly. Real drivers lack the symbol. */
API const char *reviveFakeNvmlProfilePath(void) { return profile_path(); }

API const char *nvmlErrorString(nvmlReturn_t result)
{
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
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}

/* Every device entry point starts here: UNINITIALIZED before init, INVALID_ARGUMENT for a handle
 * that is not one of ours (or one from before a shutdown). */
static nvmlReturn_t check_device(nvmlDevice_t device)
{
    if (g_refcount == 0 || !g_machine)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || device < g_machine->gpus || device >= g_machine->gpus + g_machine->n_gpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

#define DEVICE_GUARD(dev)                          \
    do {                                           \
        nvmlReturn_t guard_ = check_device(dev);   \
        if (guard_ != NVML_SUCCESS)                \
            return guard_;                         \
    } while (0)

#define OUT_GUARD(ptr)                             \
    do {                                           \
        if (!(ptr))                                \
            return NVML_ERROR_INVALID_ARGUMENT;    \
    } while (0)

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *value)
{
    OUT_GUARD(out);
    if (strlen(value) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ */
/* System queries                                                                                    */

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, g_machine->driver_version);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, g_machine->nvml_version);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    OUT_GUARD(cudaDriverVersion);
    *cudaDriverVersion = g_machine->cuda_driver_version;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

API nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    OUT_GUARD(name);
    for (unsigned int i = 0; i < g_machine->n_gpus; i++)
        for (unsigned int k = 0; k < g_machine->gpus[i].n_processes; k++)
            if (g_machine->gpus[i].processes[k].pid == pid)
                return copy_string(name, length, g_machine->gpus[i].processes[k].name);
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    OUT_GUARD(deviceCount);
    *deviceCount = g_machine->n_gpus;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    OUT_GUARD(device);
    if (index >= g_machine->n_gpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_machine->gpus[index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    OUT_GUARD(uuid);
    OUT_GUARD(device);
    for (unsigned int i = 0; i < g_machine->n_gpus; i++)
        if (strcmp(g_machine->gpus[i].uuid, uuid) == 0) {
            *device = &g_machine->gpus[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

static int same_bus_id(const char *a, const char *b)
{
    unsigned int d1, b1, v1, d2, b2, v2;
    if (parse_bus_id(a, &d1, &b1, &v1) == 0 && parse_bus_id(b, &d2, &b2, &v2) == 0)
        return d1 == d2 && b1 == b2 && v1 == v2;
    /* the legacy "0000:1A:00.0" spelling is accepted by the real library too */
    if (sscanf(a, "%x:%x:%x.", &d1, &b1, &v1) == 3 && parse_bus_id(b, &d2, &b2, &v2) == 0)
        return d1 == d2 && b1 == b2 && v1 == v2;
    return 0;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    OUT_GUARD(pciBusId);
    OUT_GUARD(device);
    for (unsigned int i = 0; i < g_machine->n_gpus; i++)
        if (same_bus_id(pciBusId, g_machine->gpus[i].bus_id)) {
            *device = &g_machine->gpus[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* ------------------------------------------------------------------------------------------------ */
/* Identity and PCI                                                                                  */

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    DEVICE_GUARD(device);
    return copy_string(name, length, device->name);
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    DEVICE_GUARD(device);
    return copy_string(uuid, length, device->uuid);
}

API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    DEVICE_GUARD(device);
    return copy_string(serial, length, device->serial);
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    DEVICE_GUARD(device);
    OUT_GUARD(index);
    *index = device->index;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    DEVICE_GUARD(device);
    OUT_GUARD(minorNumber);
    *minorNumber = device->minor_number;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, unsigned int *type)
{
    DEVICE_GUARD(device);
    OUT_GUARD(type);
    *type = device->brand;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch)
{
    DEVICE_GUARD(device);
    OUT_GUARD(arch);
    *arch = device->architecture;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    DEVICE_GUARD(device);
    OUT_GUARD(major);
    OUT_GUARD(minor);
    *major = device->cc_major;
    *minor = device->cc_minor;
    return NVML_SUCCESS;
}

static void fill_pci(const char *bus_id, unsigned int device_id, unsigned int subsystem_id, nvmlPciInfo_t *pci)
{
    unsigned int domain = 0, bus = 0, dev = 0;
    memset(pci, 0, sizeof *pci);
    parse_bus_id(bus_id, &domain, &bus, &dev);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = device_id;
    pci->pciSubSystemId = subsystem_id;
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", domain, bus, dev);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", domain & 0xFFFF, bus, dev);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEVICE_GUARD(device);
    OUT_GUARD(pci);
    fill_pci(device->bus_id, device->pci_device_id, device->pci_subsystem_id, pci);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

/* ------------------------------------------------------------------------------------------------ */
/* Memory, PCIe link                                                                                 */

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    DEVICE_GUARD(device);
    OUT_GUARD(memory);
    /* v1 "used" is the sum of reserved and allocated memory (nvml.h) */
    memory->total = device->memory_total;
    memory->used = device->memory_used;
    memory->free = device->memory_total - device->memory_used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    DEVICE_GUARD(device);
    OUT_GUARD(memory);
    if (memory->version != NVML_MEMORY_V2_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = device->memory_total;
    memory->reserved = device->memory_reserved;
    memory->used = device->memory_used - device->memory_reserved;
    memory->free = device->memory_total - device->memory_used;
    return NVML_SUCCESS;
}

#define UINT_GETTER(fn, field)                                   \
    API nvmlReturn_t fn(nvmlDevice_t device, unsigned int *out)  \
    {                                                            \
        DEVICE_GUARD(device);                                    \
        OUT_GUARD(out);                                          \
        *out = device->field;                                    \
        return NVML_SUCCESS;                                     \
    }

UINT_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, pcie_cur_gen)
UINT_GETTER(nvmlDeviceGetCurrPcieLinkWidth, pcie_cur_width)
UINT_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, pcie_max_gen)
UINT_GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie_max_gen)
UINT_GETTER(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width)
UINT_GETTER(nvmlDeviceGetPowerManagementLimit, power_limit_mw)
UINT_GETTER(nvmlDeviceGetEnforcedPowerLimit, power_limit_mw)
UINT_GETTER(nvmlDeviceGetPowerManagementDefaultLimit, power_default_limit_mw)
UINT_GETTER(nvmlDeviceGetPowerUsage, power_usage_mw)

API nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *minLimit,
                                                              unsigned int *maxLimit)
{
    DEVICE_GUARD(device);
    OUT_GUARD(minLimit);
    OUT_GUARD(maxLimit);
    *minLimit = device->power_min_limit_mw;
    *maxLimit = device->power_max_limit_mw;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, unsigned int *mode)
{
    DEVICE_GUARD(device);
    OUT_GUARD(mode);
    *mode = device->persistence_mode ? 1 : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType, unsigned int *temp)
{
    DEVICE_GUARD(device);
    OUT_GUARD(temp);
    if (sensorType != 0) /* NVML_TEMPERATURE_GPU is the only sensor */
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = device->temperature_c;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    DEVICE_GUARD(device);
    OUT_GUARD(temperature);
    if (temperature->version != NVML_TEMPERATURE_V1_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    temperature->temperature = (int)device->temperature_c;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ */
/* Utilisation, with the lab's per-GPU override file for the vLLM twin                              */

static const char *utilization_path(void)
{
    const char *p = getenv("FAKE_NVML_UTILIZATION");
    return (p && *p) ? p : "/run/fake-nvml/utilization.json";
}

/* {"<index>": {"gpu": N, "memory": M}}; an absent file or GPU means the profile's values. A file that
 * cannot be parsed also falls back to them, with one warning on stderr per process. */
static void utilization_override(const struct fake_gpu *g, nvmlUtilization_t *u)
{
    json_error_t jerr;
    json_t *root, *entry, *v;
    char key[16];
    const char *path = utilization_path();
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    root = json_loadf(f, 0, &jerr);
    fclose(f);
    if (!json_is_object(root)) {
        if (!g_utilization_warned) {
            fprintf(stderr, "fakenvml: utilization override %s ignored: %s\n", path,
                    root ? "expected an object keyed by GPU index" : jerr.text);
            g_utilization_warned = 1;
        }
        json_decref(root);
        return;
    }
    snprintf(key, sizeof key, "%u", g->index);
    entry = json_object_get(root, key);
    if (json_is_object(entry)) {
        v = json_object_get(entry, "gpu");
        if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 100)
            u->gpu = (unsigned int)json_integer_value(v);
        v = json_object_get(entry, "memory");
        if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 100)
            u->memory = (unsigned int)json_integer_value(v);
    }
    json_decref(root);
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    DEVICE_GUARD(device);
    OUT_GUARD(utilization);
    if (device->has_mig && device->mig_current)
        return NVML_ERROR_NOT_SUPPORTED; /* nvml.h: not supported on MIG-enabled GPUs */
    utilization->gpu = device->util_gpu;
    utilization->memory = device->util_memory;
    utilization_override(device, utilization);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ */
/* Affinity                                                                                          */

static nvmlReturn_t fill_mask(const unsigned long long *mask, unsigned int words, unsigned long *out)
{
    OUT_GUARD(out);
    if (words == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int w = 0; w < words; w++)
        out[w] = w < MASK_WORDS ? (unsigned long)mask[w] : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet)
{
    DEVICE_GUARD(device);
    return fill_mask(device->cpu_mask, cpuSetSize, cpuSet);
}

/* The profiles have one NUMA node per socket, so both scopes (NODE = 0, SOCKET = 1) are the same set. */
API nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int cpuSetSize,
                                                     unsigned long *cpuSet, unsigned int scope)
{
    DEVICE_GUARD(device);
    if (scope > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    return fill_mask(device->cpu_mask, cpuSetSize, cpuSet);
}

/* nvidia-smi's "NUMA Affinity" column comes from here on x86, where GetNumaNodeId is NOT_SUPPORTED. */
API nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int nodeSetSize,
                                             unsigned long *nodeSet, unsigned int scope)
{
    unsigned long long mask[MASK_WORDS] = {0};
    DEVICE_GUARD(device);
    if (scope > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    mask[device->numa_node / 64] |= 1ULL << (device->numa_node % 64);
    return fill_mask(mask, nodeSetSize, nodeSet);
}

API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    DEVICE_GUARD(device);
    OUT_GUARD(node);
    if (device->gpu_numa_id < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned int)device->gpu_numa_id;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ */
/* Topology, P2P, NVLink                                                                             */

API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                     unsigned int *pathInfo)
{
    DEVICE_GUARD(device1);
    DEVICE_GUARD(device2);
    OUT_GUARD(pathInfo);
    *pathInfo = g_machine->common_ancestor[device1->index * g_machine->n_gpus + device2->index];
    return NVML_SUCCESS;
}

/* GPUs whose common ancestor with `device` is at `level` or closer (the device itself excluded).
 * deviceArray NULL asks for the count only, which pynvml's first call relies on. */
API nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t device, unsigned int level, unsigned int *count,
                                                  nvmlDevice_t *deviceArray)
{
    unsigned int n = 0;
    DEVICE_GUARD(device);
    OUT_GUARD(count);
    if (level > 50)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int j = 0; j < g_machine->n_gpus; j++)
        if (j != device->index && g_machine->common_ancestor[device->index * g_machine->n_gpus + j] <= level)
            n++;
    if (!deviceArray) {
        *count = n;
        return NVML_SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    n = 0;
    for (unsigned int j = 0; j < g_machine->n_gpus; j++)
        if (j != device->index && g_machine->common_ancestor[device->index * g_machine->n_gpus + j] <= level)
            deviceArray[n++] = &g_machine->gpus[j];
    *count = n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, unsigned int p2pIndex,
                                        unsigned int *p2pStatus)
{
    DEVICE_GUARD(device1);
    DEVICE_GUARD(device2);
    OUT_GUARD(p2pStatus);
    if (p2pIndex >= NVML_P2P_CAPS_INDEX_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *p2pStatus = g_machine->p2p[p2pIndex][device1->index * g_machine->n_gpus + device2->index];
    return NVML_SUCCESS;
}

/* NOT_SUPPORTED on cards without NVLink (PCIe V100, T4); INVALID_ARGUMENT past the card's link count. */
static nvmlReturn_t check_link(nvmlDevice_t device, unsigned int link)
{
    DEVICE_GUARD(device);
    if (!device->has_nvlink)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= device->n_links)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

#define LINK_GUARD(dev, link)                          \
    do {                                               \
        nvmlReturn_t guard_ = check_link(dev, link);   \
        if (guard_ != NVML_SUCCESS)                    \
            return guard_;                             \
    } while (0)

API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, unsigned int *isActive)
{
    LINK_GUARD(device, link);
    OUT_GUARD(isActive);
    *isActive = device->links[link].active ? 1 : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version)
{
    LINK_GUARD(device, link);
    OUT_GUARD(version);
    *version = device->links[link].version;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    const struct fake_link *l;
    unsigned int device_id = 0, subsystem_id = 0;
    LINK_GUARD(device, link);
    OUT_GUARD(pci);
    l = &device->links[link];
    for (unsigned int j = 0; j < g_machine->n_gpus; j++)
        if (same_bus_id(l->remote_bus_id, g_machine->gpus[j].bus_id)) {
            device_id = g_machine->gpus[j].pci_device_id;
            subsystem_id = g_machine->gpus[j].pci_subsystem_id;
        }
    fill_pci(l->remote_bus_id, device_id, subsystem_id, pci);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link, unsigned int *type)
{
    LINK_GUARD(device, link);
    OUT_GUARD(type);
    *type = device->links[link].remote_device_type;
    return NVML_SUCCESS;
}

/* nvmlNvLinkCapability_t: P2P_SUPPORTED, SYSMEM_ACCESS, P2P_ATOMICS, SYSMEM_ATOMICS, SLI_BRIDGE, VALID.
 * An active data-centre link supports all but the SLI bridge. */
API nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link, unsigned int capability,
                                               unsigned int *capResult)
{
    LINK_GUARD(device, link);
    OUT_GUARD(capResult);
    if (capability >= NVML_NVLINK_CAP_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *capResult = (capability == 4) ? 0 : (device->links[link].active ? 1 : 0);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ */
/* Health: ECC, retired pages, remapped rows                                                        */

API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    DEVICE_GUARD(device);
    OUT_GUARD(current);
    OUT_GUARD(pending);
    if (!device->has_ecc)
        return NVML_ERROR_NOT_SUPPORTED;
    *current = device->ecc_current ? 1 : 0;
    *pending = device->ecc_pending ? 1 : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned int errorType, unsigned int counterType,
                                             unsigned long long *eccCounts)
{
    DEVICE_GUARD(device);
    OUT_GUARD(eccCounts);
    /* nvml.h: "Requires ECC Mode to be enabled" */
    if (!device->has_ecc || !device->ecc_current)
        return NVML_ERROR_NOT_SUPPORTED;
    if (errorType > 1 || counterType > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    *eccCounts = device->ecc_counts[errorType][counterType];
    return NVML_SUCCESS;
}

/* Two-call protocol: *pageCount smaller than the number of pages -> INSUFFICIENT_SIZE with the needed
 * count written back; zero pages with a zero count is SUCCESS. */
static nvmlReturn_t retired_pages(nvmlDevice_t device, unsigned int cause, unsigned int *pageCount,
                                  unsigned long long *addresses, unsigned long long *timestamps)
{
    unsigned int needed;
    DEVICE_GUARD(device);
    OUT_GUARD(pageCount);
    if (!device->has_retired_pages)
        return NVML_ERROR_NOT_SUPPORTED;
    if (cause > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    needed = device->n_pages[cause];
    if (*pageCount < needed) {
        *pageCount = needed;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (needed > 0 && !addresses)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < needed; i++) {
        addresses[i] = device->pages[cause][i].address;
        if (timestamps)
            timestamps[i] = device->pages[cause][i].timestamp;
    }
    *pageCount = needed;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, unsigned int cause, unsigned int *pageCount,
                                           unsigned long long *addresses)
{
    return retired_pages(device, cause, pageCount, addresses, NULL);
}

API nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, unsigned int cause, unsigned int *pageCount,
                                              unsigned long long *addresses, unsigned long long *timestamps)
{
    return retired_pages(device, cause, pageCount, addresses, timestamps);
}

API nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, unsigned int *isPending)
{
    DEVICE_GUARD(device);
    OUT_GUARD(isPending);
    if (!device->has_retired_pages)
        return NVML_ERROR_NOT_SUPPORTED;
    *isPending = device->retired_pending ? 1 : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                           unsigned int *isPending, unsigned int *failureOccurred)
{
    DEVICE_GUARD(device);
    OUT_GUARD(corrRows);
    OUT_GUARD(uncRows);
    OUT_GUARD(isPending);
    OUT_GUARD(failureOccurred);
    /* nvml.h: Ampere or newer; NOT_SUPPORTED when MIG is enabled */
    if (!device->has_remapped_rows || (device->has_mig && device->mig_current))
        return NVML_ERROR_NOT_SUPPORTED;
    *corrRows = device->remap_correctable;
    *uncRows = device->remap_uncorrectable;
    *isPending = device->remap_pending ? 1 : 0;
    *failureOccurred = device->remap_failure ? 1 : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    DEVICE_GUARD(device);
    OUT_GUARD(currentMode);
    OUT_GUARD(pendingMode);
    if (!device->has_mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = device->mig_current ? 1 : 0;
    *pendingMode = device->mig_pending ? 1 : 0;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ */
/* Running compute processes. Two-call protocol: a zero count with no processes is SUCCESS ("none"),  */
/* too small a count is INSUFFICIENT_SIZE with the needed count written back.                         */

static nvmlReturn_t compute_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos, int v1_layout)
{
    unsigned int needed;
    DEVICE_GUARD(device);
    OUT_GUARD(infoCount);
    needed = device->n_processes;
    if (*infoCount < needed) {
        *infoCount = needed;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (needed > 0 && !infos)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < needed; i++) {
        if (v1_layout) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
            p->pid = device->processes[i].pid;
            p->usedGpuMemory = device->processes[i].used_memory_bytes;
        } else {
            nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)infos + i;
            p->pid = device->processes[i].pid;
            p->usedGpuMemory = device->processes[i].used_memory_bytes;
            p->gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT; /* not a MIG instance */
            p->computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
        }
    }
    *infoCount = needed;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                         nvmlProcessInfo_v2_t *infos)
{
    return compute_processes(device, infoCount, infos, 0);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                         nvmlProcessInfo_v2_t *infos)
{
    return compute_processes(device, infoCount, infos, 0);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_v1_t *infos)
{
    return compute_processes(device, infoCount, infos, 1);
}
