/* Private to the decoder: decode.c (headers, markers, objects, device work)
 * and mpparse.c (msgpack units parsed straight into values). Not installed. */
#ifndef GSER_HOST_DECODE_H
#define GSER_HOST_DECODE_H

#include "internal.h"

typedef struct dec_object dec_object_t;
struct mp_unit;

typedef struct dec {
    gser_context_t *ctx;
    gser_msg_t *msg;
    unsigned flags;
    gser_limits_t lim;
    const gser_frame_t *frames; /* data frames (the header is not among them) */
    size_t nframes;
    size_t nodes_left; /* msgpack items still allowed */
    FILE *trace;
    path_t path;      /* where the unit being parsed sits: its object's path, empty for the header */
    const char *what; /* "gser_deserialize" or the inspecting call */
    uint32_t version; /* of the header's wire format */
    bool checked;     /* kept sub-headers were walked with their enclosing one's */
    bool defer;       /* objects met now are rebuilt once the frame table is checked */
    dec_object_t *later; /* those objects, in the order they were met */
    size_t nlater, cap_later;
    char cb_err[512];
    /* device work (GSER_DESERIALIZE_RESTORE_DEVICE, _SCATTER) */
    void *stream;
    void **uploaded;          /* per data frame: its copy on the device, made on first use */
    gser_value_t **dev_vals;  /* device buffers that gser copied: get the event, maybe a scatter */
    size_t ndev_vals, cap_dev_vals;
    size_t flushed;           /* dev_vals before this one are done */
    /* compressed frames (wire version 3): frames are then the decompressed ones */
    const gser_frame_t *wire; /* the data frames as given */
    frame_codec_t *codecs;    /* per data frame, from the frame table; NULL when none is compressed */
    /* Turn the array v, whose items are the fields of a buffer, array or
     * object marker, into the value it describes, in place (decode.c's
     * dec_marker): called by the parser, which thus needs nothing of the
     * decoder's file. */
    gser_status_t (*finish_marker)(struct mp_unit *u, gser_value_t *v);
} dec_t;

/* Internal kinds of values that exist only while a unit is parsed. */
enum {
    MP_KIND_EXT = 0xfe, /* an empty ext: a marker's first item (u.i is its type) */
};

/* gser_list_t.marker while an array is parsed: what its items are. */
enum {
    MARK_NONE = 0,     /* a list (or a tuple: the value's kind says) */
    MARK_BUFFER = GSER_EXT_BUFFER,
    MARK_ARRAY = GSER_EXT_ARRAY,
    MARK_OBJECT = GSER_EXT_OBJECT,
    MARK_FIELD = 0xfd, /* a field of one of those markers: integers only */
    MARK_MUST = 0xfe,  /* at the depth limit: its items are allowed only if it is a marker */
};

/* One msgpack unit being parsed into values (msgpack-c's unpack template's
 * user data, mpparse.c). */
typedef struct mp_unit {
    dec_t *d;
    gser_msg_t *msg;
    const char *unit;  /* "header" or "sub-header", for messages */
    size_t depth;      /* value depth of the unit's root */
    size_t open;       /* containers open (the template's stack height) */
    size_t bytes_left; /* every declared item takes at least one byte of its own */
    size_t fbase, fn;  /* the frames references may name: [fbase, fbase + fn) */
    gser_status_t st;  /* what a callback failed with (its message is set) */
    gser_value_t ext;  /* the empty ext just read, until its array takes it */
    bool trace;
    char pending[600]; /* a list's trace line, held until its first item says it is a list */
    size_t pending_kind; /* where "list" is in it */
} mp_unit_t;

/* Parse the msgpack object at p[0..len) into values in d->msg, its root at
 * value depth `depth`, its references in frames [fbase, fbase + fn). With
 * whole, the object must be all of p[0..len); else *used is its length.
 * unit names it in messages ("header", "sub-header"), off is where p is in
 * what the messages count bytes of. */
GSER_INTERNAL gser_status_t gser__mp_parse_unit(dec_t *d, const unsigned char *p, size_t len, size_t depth,
                                                size_t fbase, size_t fn, bool whole, const char *unit, size_t off,
                                                gser_value_t **out, size_t *used);

/* The path of the item being parsed now: the unit's path, then each open
 * container's current slot. */
GSER_INTERNAL void gser__mp_unit_path(const mp_unit_t *u, path_t *p);

/* Fail the unit: st with "<what>: <path>: <fmt...>" as the context's error. */
GSER_INTERNAL gser_status_t gser__mp_unit_fail(mp_unit_t *u, gser_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
GSER_INTERNAL void gser__mp_unit_trace(mp_unit_t *u, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* GSER_HOST_DECODE_H */
