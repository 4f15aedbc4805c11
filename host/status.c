/* Names of statuses, kinds, dtypes and memory kinds. */
#include "internal.h"

const char *gser_status_str(gser_status_t status)
{
    switch (status) {
    case GSER_INPROGRESS: return "GSER_INPROGRESS: in progress";
    case GSER_OK: return "GSER_OK: success";
    case GSER_ERR_INVALID_ARG: return "GSER_ERR_INVALID_ARG: invalid argument";
    case GSER_ERR_NO_MEMORY: return "GSER_ERR_NO_MEMORY: out of memory";
    case GSER_ERR_NOT_FOUND: return "GSER_ERR_NOT_FOUND: not found";
    case GSER_ERR_EXISTS: return "GSER_ERR_EXISTS: already registered";
    case GSER_ERR_UNKNOWN_FAMILY: return "GSER_ERR_UNKNOWN_FAMILY: unknown serializer family";
    case GSER_ERR_NO_SERIALIZER: return "GSER_ERR_NO_SERIALIZER: no serializer in the families given";
    case GSER_ERR_VERSION: return "GSER_ERR_VERSION: type version not readable";
    case GSER_ERR_UNKNOWN_TYPE: return "GSER_ERR_UNKNOWN_TYPE: type not registered";
    case GSER_ERR_BAD_MAGIC: return "GSER_ERR_BAD_MAGIC: not a gser message";
    case GSER_ERR_WIRE_VERSION: return "GSER_ERR_WIRE_VERSION: unsupported wire format version";
    case GSER_ERR_FORMAT: return "GSER_ERR_FORMAT: malformed message";
    case GSER_ERR_TRUNCATED: return "GSER_ERR_TRUNCATED: message truncated";
    case GSER_ERR_FRAME: return "GSER_ERR_FRAME: frame missing, mis-sized or out of bounds";
    case GSER_ERR_LIMIT_DEPTH: return "GSER_ERR_LIMIT_DEPTH: nesting too deep";
    case GSER_ERR_LIMIT_NODES: return "GSER_ERR_LIMIT_NODES: too many values";
    case GSER_ERR_LIMIT_FRAMES: return "GSER_ERR_LIMIT_FRAMES: too many frames";
    case GSER_ERR_LIMIT_BYTES: return "GSER_ERR_LIMIT_BYTES: message too large";
    case GSER_ERR_TYPE_MISMATCH: return "GSER_ERR_TYPE_MISMATCH: value is of another kind";
    case GSER_ERR_OUT_OF_RANGE: return "GSER_ERR_OUT_OF_RANGE: index out of range";
    case GSER_ERR_STATE: return "GSER_ERR_STATE: not allowed in this state";
    case GSER_ERR_IO: return "GSER_ERR_IO: input/output error";
    case GSER_ERR_UNSUPPORTED: return "GSER_ERR_UNSUPPORTED: not supported";
    case GSER_ERR_CALLBACK: return "GSER_ERR_CALLBACK: callback failed";
    case GSER_ERR_DEVICE: return "GSER_ERR_DEVICE: device error";
    case GSER_ERR_NO_DEVICE: return "GSER_ERR_NO_DEVICE: no usable device backend";
    case GSER_ERR_CONNECTION: return "GSER_ERR_CONNECTION: connection lost or refused";
    case GSER_ERR_TIMEOUT: return "GSER_ERR_TIMEOUT: timed out";
    case GSER_ERR_CANCELED: return "GSER_ERR_CANCELED: canceled";
    case GSER_ERR_ACCESS: return "GSER_ERR_ACCESS: access refused";
    case GSER_ERR_COMPRESSED: return "GSER_ERR_COMPRESSED: corrupt compressed frame";
    }
    return "GSER_ERR_?: unknown status";
}

const char *gser_memory_str(gser_memory_t memory)
{
    switch (memory) {
    case GSER_MEMORY_HOST: return "host";
    case GSER_MEMORY_DEVICE: return "device";
    }
    return "?";
}

const char *gser_kind_str(gser_kind_t kind)
{
    static const char *const names[] = {"nil", "bool", "int", "uint", "float", "str", "bytes",
                                        "list", "tuple", "map", "buffer", "object", "serialized"};
    return (unsigned)kind < sizeof names / sizeof names[0] ? names[kind] : "?";
}

static const struct {
    const char *name;
    size_t size;
} dtypes[GSER_DTYPE_COUNT] = {
    [GSER_DTYPE_BYTES] = {"bytes", 1},       [GSER_DTYPE_BOOL] = {"bool", 1},
    [GSER_DTYPE_INT8] = {"int8", 1},         [GSER_DTYPE_INT16] = {"int16", 2},
    [GSER_DTYPE_INT32] = {"int32", 4},       [GSER_DTYPE_INT64] = {"int64", 8},
    [GSER_DTYPE_UINT8] = {"uint8", 1},       [GSER_DTYPE_UINT16] = {"uint16", 2},
    [GSER_DTYPE_UINT32] = {"uint32", 4},     [GSER_DTYPE_UINT64] = {"uint64", 8},
    [GSER_DTYPE_FLOAT16] = {"float16", 2},   [GSER_DTYPE_BFLOAT16] = {"bfloat16", 2},
    [GSER_DTYPE_FLOAT32] = {"float32", 4},   [GSER_DTYPE_FLOAT64] = {"float64", 8},
    [GSER_DTYPE_COMPLEX64] = {"complex64", 8}, [GSER_DTYPE_COMPLEX128] = {"complex128", 16},
};

size_t gser_dtype_size(gser_dtype_t dtype)
{
    return (unsigned)dtype < GSER_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

const char *gser_dtype_str(gser_dtype_t dtype)
{
    return (unsigned)dtype < GSER_DTYPE_COUNT ? dtypes[dtype].name : "?";
}

const char *gser_version_str(void)
{
#define GSER_STR_(x) #x
#define GSER_STR(x) GSER_STR_(x)
    return GSER_STR(GSER_VERSION_MAJOR) "." GSER_STR(GSER_VERSION_MINOR) "." GSER_STR(GSER_VERSION_PATCH);
}
