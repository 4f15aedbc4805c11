/* What gser-demo and gser-bench-arrow share: setting up a context and a UCX
 * worker, and the synthetic table: C columns of int64,
 * float64 with nulls, utf8 and list<int32> in turn, built as an Arrow C Device
 * Data table in host or device memory, and a checksum of a column's logical
 * values that any valid layout of the same values agrees on. */
#ifndef GSER_TOOLS_DEMO_TABLE_H
#define GSER_TOOLS_DEMO_TABLE_H

#include <stdbool.h>
#include <stdint.h>

#include <gser/arrow.h>
#include <gser/gser.h>
#include <gser/ucx.h>

enum { COL_INT64, COL_FLOAT64, COL_UTF8, COL_LIST, COL_KINDS };
extern const char *const col_format[COL_KINDS];
extern const char *const col_kind_name[COL_KINDS];

/* Who is talking, for the messages of die(). */
extern const char *who;

/* Print "who: what: status: detail" and exit(1). */
void die(const char *what, gser_status_t st, const char *detail);

#define CK(ctx, call)                                                                                        \
    do {                                                                                                     \
        gser_status_t st_ = (call);                                                                          \
        if (st_ != GSER_OK)                                                                                  \
            die(#call, st_, gser_context_get_last_error(ctx));                                                   \
    } while (0)

#define CKU(call)                                                                                            \
    do {                                                                                                     \
        gser_status_t st_ = (call);                                                                          \
        if (st_ != GSER_OK)                                                                                  \
            die(#call, st_, gser_ucx_get_last_error());                                                          \
    } while (0)

/* A gser context (device backend as GSER_DEVICE says) with the Arrow type. */
gser_context_t *make_ctx(void);

/* A UCX transport context and one worker using ctx's device backend. */
void make_worker(gser_context_t *ctx, gser_ucx_context_t **uc, gser_ucx_worker_t **w);

/* The next peer that finished its handshake, waiting up to timeout_ms in
 * all. A peer that fails its handshake (another version, no secret, bytes
 * that stop halfway) is reported on stderr and the wait goes on: anyone who
 * reaches the port can cause that. Exits on the listener's own errors and
 * when no peer came in time. */
gser_ucx_ep_t *accept_peer(gser_ucx_listener_t *l, int timeout_ms);

/* A table of rows x cols in device memory (device) or host memory; released
 * by the arrays' and the schema's release callbacks. */
void make_table(gser_context_t *ctx, bool device, int64_t rows, int cols, struct ArrowDeviceArray *da,
                struct ArrowSchema *schema);

/* Checksum of column a (format is its schema format), hashing 64-bit words:
 * host tables are read in place, device tables through host copies. */
uint64_t column_checksum(gser_context_t *ctx, bool device, const struct ArrowArray *a, const char *format);

#endif
