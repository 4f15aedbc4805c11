/* Private definitions of the UCX transport. Not installed.
 *
 * Threading: every public entry point takes the worker's lock (a recursive
 * mutex, only in GSER_UCX_THREAD_MULTI). UCX callbacks only record what
 * happened and queue work; the work itself (posting follow-up receives,
 * failing endpoints, user callbacks) runs in gux_progress after UCX's own
 * progress returns, so nothing is posted from inside a UCX callback. */
#ifndef GSER_UCX_INTERNAL_H
#define GSER_UCX_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include <ucp/api/ucp.h>

#include "error.h"
#include "gser/device.h"
#include "gser/extension.h"
#include "gser/testing.h"
#include "gser/ucx.h"
#include "wire.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gser supports little-endian hosts only"
#endif

#define GUX_INTERNAL __attribute__((visibility("hidden")))

/* Defaults (documented in gser/ucx.h and gser/context.h). */
#define GUX_DEFAULT_PEER_TIMEOUT_MS 10000u
/* A handshake must finish within the peer timeout, or this when it is off. */
#define GUX_DEFAULT_HANDSHAKE_MS 10000u
/* Handshakes a listener runs at once; the oldest is dropped for a new one. */
#define GUX_MAX_PENDING 256
/* Heartbeats go out this many times per peer timeout. */
#define GUX_HEARTBEATS_PER_TIMEOUT 4
/* The shortest timeout a peer's hello may ask this side to heartbeat for. */
#define GUX_MIN_PEER_TIMEOUT_MS 100u
#define GUX_DEFAULT_INLINE_MAX 8192u
#define GUX_DEFAULT_INLINE_BUDGET 65536u
#define GUX_DEFAULT_CHUNK ((size_t)4 << 20)
#define GUX_DEFAULT_DEPTH 4u
#define GUX_DEFAULT_RECV_CACHE ((size_t)256 << 20)
#define GUX_DEFAULT_MAX_FRAMES ((size_t)1 << 20)
#define GUX_DEFAULT_MAX_BYTES ((uint64_t)1 << 40)
/* How long teardown waits for UCX to finish closing before giving up. */
#define GUX_CLOSE_TIMEOUT_MS 2000
/* How long closing an endpoint waits for UCX to give back the sends it kept
 * at its close (a peer that does not progress can hold them longer). */
#define GUX_RELEASE_WAIT_MS 500
/* How long UCX gets to notice a peer that left before its endpoint is closed anyway. */
#define GUX_LOST_GRACE_MS 200
/* Longest a destroy lets UCX finish tearing a connection down. */
#define GUX_SETTLE_MS 20
/* Heads up to this size are built inside the request, without a malloc. */
#define GUX_HEAD_INLINE 256
/* Receives of up to this many frames keep their table and frame array in
 * the request itself. */
#define GUX_FRAMES_INLINE 4
/* Freed requests kept for reuse, per worker. */
#define GUX_REQ_CACHE 256
/* Received frames start at this alignment (a cache line). */
#define GUX_FRAME_ALIGN 64

/* ---- intrusive lists ------------------------------------------------------- */

typedef struct gux_list {
    struct gux_list *prev, *next;
} gux_list_t;

static inline void gux_list_init(gux_list_t *l)
{
    l->prev = l->next = l;
}
static inline bool gux_list_empty(const gux_list_t *l)
{
    return l->next == l;
}
static inline bool gux_list_linked(const gux_list_t *n)
{
    return n->next != NULL && n->next != n;
}
static inline void gux_list_push(gux_list_t *l, gux_list_t *n)
{
    n->prev = l->prev;
    n->next = l;
    l->prev->next = n;
    l->prev = n;
}
static inline void gux_list_del(gux_list_t *n)
{
    if (!gux_list_linked(n))
        return;
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}
#define gux_container(ptr, type, member) ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

/* ---- status conversion: the one place ucs_status_t becomes gser_status_t ------ */

GUX_INTERNAL gser_status_t gux_status(ucs_status_t st);
/* Convert st; on an error also record "what: <UCX's message>". */
GUX_INTERNAL gser_status_t gux_check(ucs_status_t st, const char *what);
/* Write an output struct as far as its size says; GSER_ERR_INVALID_ARG
 * ("what: arg->size is 0: use init") for a size of 0. */
GUX_INTERNAL gser_status_t gux_struct_write(const char *what, const char *arg, const char *init, void *dst,
                                            const void *src, size_t src_size);
/* The prologue of the three non-blocking operations (send, receive from an
 * endpoint, from any): *params read as its size says into copy (then
 * pointing there), and their target and a request or a callback required
 * (GSER_ERR_INVALID_ARG naming what, the function). */
GUX_INTERNAL gser_status_t gux_op_params(const char *what, const gser_ucx_op_params_t **params,
                                         gser_ucx_op_params_t *copy);
GUX_INTERNAL gser_status_t gux_op_check(const char *what, bool target, bool want_req,
                                        const gser_ucx_op_params_t *params);
/* The UCX call wrapper: every ucp_* call that returns a status goes through it. */
#define GUX_CALL(what, call) gux_check((call), (what))

/* ---- tables of objects by id (slots.c, a leaf) -----------------------------------
 * An id is the slot index + 1 in its low 20 bits and a generation above, so
 * that an id kept past its object's end never finds the slot's next owner. */

typedef struct gux_slots {
    void **items;
    uint32_t *gen;
    size_t n, hint;
} gux_slots_t;

GUX_INTERNAL gser_status_t gux_slot_take(gux_slots_t *t, void *item, uint32_t *id);
GUX_INTERNAL void gux_slot_put(gux_slots_t *t, uint32_t id);
GUX_INTERNAL void *gux_slot_get(const gux_slots_t *t, uint32_t id);
/* Put item where id's slot is (an object that moved). */
GUX_INTERNAL void gux_slot_set(gux_slots_t *t, uint32_t id, void *item);
GUX_INTERNAL void gux_slots_free(gux_slots_t *t);

/* ---- compression (endpoint.c) -------------------------------------------------- */

/* Codec bits (GSER_UCX_CAP_LZ4/_ZSTD) a build of this transport reads. */
#define GUX_CODECS (GSER_UCX_CAP_LZ4 | GSER_UCX_CAP_ZSTD)

/* The gser_compression_t an endpoint whose handshake is done writes with. */
GUX_INTERNAL int gux_ep_codec(const gser_ucx_ep_t *ep);
/* Whether host names the local host as seen from local: a loopback
 * address, or local itself. */
GUX_INTERNAL bool gux_host_is_local(const char *host, const char *local);
/* For tests: the codecs the worker announces (and accepts) in handshakes
 * it starts from now on; GUX_CODECS by default. */
GUX_INTERNAL void gux_worker_set_announce_codecs(gser_ucx_worker_t *w, uint32_t codecs);
/* For tests: whether the worker announces GSER_UCX_CAP_CHUNKED in
 * handshakes it starts from now on (true by default). */
GUX_INTERNAL void gux_worker_set_announce_chunked(gser_ucx_worker_t *w, bool on);
/* Whether ep sends frames of at least w->zchunk_min bytes in compressed
 * chunks when it compresses: both sides announced GSER_UCX_CAP_CHUNKED. */
GUX_INTERNAL bool gux_ep_chunked(const gser_ucx_ep_t *ep);
/* ---- link-aware compression (link.c) --------------------------------------------- */

/* Sends of at least this many bytes are timed when UCX does not complete
 * them at once (smaller ones say little: their completion says UCX took
 * them, not that they crossed the link). */
#define GUX_LINK_PART_MIN ((size_t)64 << 10)
/* Messages with fewer candidate bytes keep the last decision, unsampled:
 * smaller raw sends would measure what the sockets' buffers take in, not
 * the link (with every message from 256 KiB deciding, a 4M-row shuffle at
 * 100 Mbit/s took 1.5 times tcp:// with lz4, against 0.77 with 1 MiB). */
#define GUX_LINK_MSG_MIN ((size_t)1 << 20)

/* What the model knows: the wire's rate and, per codec (0 lz4, 1 zstd),
 * seconds per raw byte to compress and decompress and the ratio. */
typedef struct gux_link_model {
    double rate; /* wire bytes per second; 0: unknown */
    bool cold;   /* rate is one measurement, of a cold connection: the next replaces it */
    struct gux_link_codec {
        bool known;
        double ratio, ctime, dtime;
        /* What the codec's messages really took over what the model said
         * (0: none measured yet: 1), learnt from its own sends (link.c) */
        double fix;
        unsigned runs;  /* measurements folded into fix */
        bool tried;     /* sent once to learn fix (explore) */
        bool cold_fix;  /* fix is a cold run's bound (link.c): a warm run replaces it */
        /* ctime and dtime on samples the codec shrank to gser's threshold
         * (a codec is faster on data it cannot shrink: lz4 13.8 GB/s on
         * random float64, 1.3 on columns), for gux_link_raw_wins */
        bool shrunk;
        double shrunk_ctime, shrunk_dtime;
        /* What the codec's messages really compressed to over what their
         * samples said (0: none measured yet: 1; link.c) */
        double rfix;
    } codec[2];
} gux_link_model_t;

/* An endpoint's measurements and decisions (under the worker's lock). */
typedef struct gux_link {
    gux_link_model_t m;    /* m.rate: of raw sends (compressed ones only raise it) */
    double zrate;          /* bytes per second of compressed sends (their wire may wait on CPU) */
    double held;           /* a raw window far below m.rate, not taken yet (link.c; 0: none) */
    bool slowing;          /* the last raw windows were far below, and taken */
    unsigned inflight;     /* timed sends posted, not completed */
    double busy_since;     /* ms: start of the busy time not yet counted */
    double win_bytes;      /* bytes completed in the current window */
    double win_ms;         /* busy ms in it */
    int win_kind;          /* its sends: 0 none yet, 1 raw, 2 compressed, 3 both (not counted) */
    double win_first_ms;   /* its first completion (0: none yet) ... */
    double win_first_bytes; /* ... and the bytes completed with it */
    bool win_cont;          /* the window goes on from a busy one (its buffers were full at its start) */
    /* A codec run: compressed messages with one codec, from the first's
     * decision to the last timed completion, against the model's time for
     * them (uncorrected), to learn that codec's fix. */
    struct {
        bool open;
        bool tried; /* its codec went to be tried (explore) */
        int codec;
        double start, last_done; /* ms */
        double est;              /* s: the model's (uncorrected) */
        double raw, wire, expect; /* bytes: decided, completed, predicted on the wire */
        uint64_t id;   /* (nonzero) which run a send request joined */
        unsigned reqs; /* its send requests not completed */
        bool posted;   /* its messages are all posted (gser_ucx_ep_mark_posted) */
        double sent;   /* bytes its requests posted (-1: some compress as they go: unknown) */
    } run;
    uint64_t run_ids;      /* the last run's id */
    bool marks_posted;     /* the caller says when a message is posted: runs end on their requests */
    double sampled_at;     /* ms: codecs last timed (0: never) */
    double probed_at;      /* ms: last raw probe (or first decision) */
    uint64_t since_probe;  /* compressed decisions since */
    double saved;          /* s: what they saved over raw, in the model */
    bool cold_probed;      /* the probe that re-measures a cold rate went */
    bool warm;             /* a codec run ended: the first is cold, not measured */
    int last;              /* last decision (gser_compression_t) ... */
    bool decided;          /* ... once there is one */
    double estimate[3];
    uint64_t decisions, samples, rate_samples, probes, runs, explores;
    uint64_t raw_wins;         /* decisions raw by the measurements alone (gser_ucx_ep_raw_wins) */
    uint64_t since_sample;     /* of those, since the codecs were last timed */
    uint64_t cold_runs; /* cold runs that bounded a codec's fix */
} gux_link_t;

/* What a worker learnt of the links to a peer host, for its next
 * endpoints there (Dask opens many comms to each peer). */
#define GUX_LINK_HOSTS 16
typedef struct gux_link_host {
    char host[48];
    gux_link_model_t m; /* m.rate 0: nothing measured yet */
    double at; /* ms: last written (0: free) */
    /* ms: an endpoint (measurer) went raw to measure the link, nothing
     * measured yet (0: none) */
    double measuring;
    const void *measurer;
} gux_link_host_t;

/* The model's seconds to move bytes raw (codec NONE), or compressed with
 * GSER_COMPRESSION_LZ4/_ZSTD: whole (chunk 0: compress, wire, decompress
 * in turn) or in chunks of chunk bytes pipelined with the wire. Negative
 * when the model cannot tell (rate or codec unknown). */
GUX_INTERNAL double gux_link_time(const gux_link_model_t *m, int codec, size_t bytes, size_t chunk);
/* The codec that moves bytes fastest among NONE and the codecs in allowed
 * (GSER_UCX_CAP_LZ4/_ZSTD bits); a codec wins only when it saves
 * GUX_LINK_MARGIN of the raw time. times (3, may be NULL): the estimates. */
GUX_INTERNAL int gux_link_choose(const gux_link_model_t *m, size_t bytes, size_t chunk, uint32_t allowed,
                                 double *times);
/* Fold one measurement into the model (tests inject them so): a send
 * rate (bytes per second), or a codec's ratio and speeds. */
GUX_INTERNAL void gux_link_add_rate(gux_link_t *l, double rate, bool raw);
GUX_INTERNAL void gux_link_add_codec(gux_link_t *l, int codec, double ratio, double ctime, double dtime);
/* A message of raw bytes was decided to go as codec at now_ms, the model
 * saying est seconds (uncorrected): opens, extends or closes the codec run
 * that learns the codec's fix. */
GUX_INTERNAL void gux_link_run_note(gux_link_t *l, int codec, double raw, double est, double now_ms);
/* One codec run's measurement folded in: real seconds where the model
 * said est (tests inject them so). */
GUX_INTERNAL void gux_link_add_fix(gux_link_t *l, int codec, double real, double est);
/* A timed send (len >= GUX_LINK_PART_MIN) was posted / completed, at now_ms. */
GUX_INTERNAL void gux_link_posted(gux_link_t *l, double now_ms, bool raw);
GUX_INTERNAL void gux_link_done(gux_link_t *l, size_t len, double now_ms);
/* gux_link_done for ep's link; a rate it measures is shared with the
 * worker's next endpoints to the peer's host (under the worker's lock). */
GUX_INTERNAL void gux_ep_link_done(gser_ucx_ep_t *ep, size_t len, double now_ms);
/* A timed send that was posted completed at once (ok) or failed: it says
 * nothing of the wire, but ends a codec run's work as a completion does. */
GUX_INTERNAL void gux_link_at_once(gux_link_t *l, size_t len, double now_ms, bool ok);
/* Measure the open codec run if all it sent completed (before deciding). */
GUX_INTERNAL void gux_link_run_settle(gux_link_t *l);
/* A send request of bytes is posted (compressing: its frames are
 * compressed in chunks as it goes, their size unknown here): the id of the
 * open run it joins (every request until the run's messages are marked
 * posted), or 0. */
GUX_INTERNAL uint64_t gux_link_run_join(gux_link_t *l, size_t bytes, bool compressing);
/* A request of run id completed (ok) or failed, at now_ms. */
GUX_INTERNAL void gux_link_run_req_done(gux_link_t *l, uint64_t id, bool ok, double now_ms);
/* The open run's messages are all posted (gser_ucx_ep_mark_posted). */
GUX_INTERNAL void gux_link_run_posted(gux_link_t *l);
/* Whether raw moves bytes fastest in m whatever the data's ratio (every
 * codec in allowed sampled; chunk as gux_link_time's): the model's choice
 * with each codec's ratio taken as 0, its best case, is raw. */
GUX_INTERNAL bool gux_link_raw_wins(const gux_link_model_t *m, size_t bytes, size_t chunk, uint32_t allowed);
/* Whether ep decides by the link (AUTO in effect and a codec to choose). */
GUX_INTERNAL bool gux_ep_link_aware(const gser_ucx_ep_t *ep);

/* For tests: the gser wire version the worker announces (0: GSER_WIRE_VERSION). */
GUX_INTERNAL void gux_worker_set_announce_gser_version(gser_ucx_worker_t *w, uint32_t version);

/* ---- objects ------------------------------------------------------------------- */

struct gser_ucx_context {
    ucp_context_h ucp;
    uint32_t caps;
    /* options, kept for the UCX contexts of workers whose network devices
     * follow their listen address */
    char *transports;
    char *net_devices;    /* NULL: UCX_NET_DEVICES, else the listen address's device */
    unsigned timeout_ms;  /* peer timeout; 0: off */
    unsigned handshake_ms;
    unsigned char *secret; /* NULL: none */
    size_t secret_len;
    uint32_t mm_fifo;      /* the shared-memory FIFO size of ucp (worker.c, mm_fifo_size) */
};

/* Something on the worker's epoll set that gser owns: a listening socket or
 * a control connection. The epoll tag is its id in the worker's table. */
typedef enum gux_io_kind { GUX_IO_LISTENER = 1, GUX_IO_PCONN = 2, GUX_IO_EP = 3 } gux_io_kind_t;

typedef struct gux_io {
    int fd;
    uint32_t id;
    gux_io_kind_t kind;
    uint32_t events; /* EPOLLIN, EPOLLOUT registered */
} gux_io_t;

typedef enum gux_ctl_step {
    GUX_CTL_NONE = 0,   /* closed */
    GUX_CTL_CONNECTING, /* the client's TCP connect runs */
    GUX_CTL_HELLO,      /* reading the peer's hello */
    GUX_CTL_PROOF,      /* reading the peer's proof of the secret */
    GUX_CTL_SETUP,      /* reading the peer's setup record */
    GUX_CTL_OPEN,       /* established: heartbeats, then a bye */
} gux_ctl_step_t;

/* A control connection (control.c). */
typedef struct gux_ctl {
    gux_io_t io;
    bool server;
    gux_ctl_step_t step;
    /* the unit being read: a hello, a record header, or a record's body */
    unsigned char in[GUX_HELLO_LEN];
    unsigned char *body; /* a body too long for in[] */
    unsigned char *dst;
    size_t have, need;
    bool in_body;
    gux_rec_t rec;
    /* bytes the socket did not take yet */
    unsigned char *out;
    size_t out_len, out_off;
    unsigned char hello_mine[GUX_HELLO_LEN], hello_peer[GUX_HELLO_LEN];
    double deadline; /* the handshake ends by then */
    double last_rx;  /* when the peer last sent anything */
    double next_hb;  /* our next heartbeat */
    unsigned hb_ms;  /* 0: no heartbeats */
    char peer_name[64];
    struct sockaddr_storage peer_sa;
} gux_ctl_t;

/* An address the admission filter lets through, and how many endpoints
 * want it (filter.c). */
typedef struct gux_allow {
    unsigned char ip[GUX_IP_LEN];
    unsigned refs;
} gux_allow_t;

typedef struct gux_pconn {
    gux_ctl_t ctl;
    gser_ucx_listener_t *listener;
    gux_list_t link; /* in listener->pending, oldest first */
} gux_pconn_t;

typedef struct gux_staging gux_staging_t;
typedef struct gux_pool gux_pool_t;

/* A message the worker sends itself (probe.c). */
typedef struct gux_probe {
    ucp_ep_h ep;        /* to the worker's own address */
    void *recv_req, *send_req;
    bool got;           /* it arrived */
    bool again;         /* another peer died while it ran: check once more after it */
    bool shm_known, shm; /* whether UCX loaded a shared-memory transport (else no check) */
    double deadline;    /* 0: no check running */
    uint64_t rounds;    /* worker->rounds when it started */
    uint32_t seq;
    unsigned char sbuf[8], rbuf[8];
} gux_probe_t;

struct gser_ucx_worker {
    gser_ucx_context_t *ctx;
    ucp_worker_h ucp;         /* NULL until the worker first listens or connects */
    ucp_context_h ucp_ctx;    /* the UCX context it came from */
    bool ucp_ctx_own;         /* a context of its own (network devices of its listen address) */
    ucp_address_t *ucp_addr;  /* its worker address, sent in setup records */
    size_t ucp_addr_len;
    gser_ucx_thread_mode_t thread_mode;
    bool mt;
    pthread_mutex_t lock;
    int efd;                  /* an epoll set: UCX's event fd, the timer, gser's sockets */
    int tfd;                  /* timerfd for handshake deadlines, heartbeats and silence */
    bool blocking_sleep;
    gux_slots_t io;           /* gux_io_t by id */
    double timer_next;        /* the earliest deadline (ms) */
    unsigned ctl_rounds;      /* progress rounds since the sockets were looked at */
    double ctl_last;          /* when they were looked at last (ms) */
    uint64_t head_max;        /* gux_head_max of the limits below */
    uint64_t rounds;          /* UCX progress rounds so far */
    bool ctl_now;             /* look at them in the next round */
    double timer_set;         /* the deadline the timer fd holds (NAN: unknown): arm() skips setting it again */
    ucp_worker_h armed_ucp;   /* armed (worker.c, arm) with this UCX worker, and not woken since; NULL: not armed */
    int ucx_lfds[16];         /* UCX's listening sockets, which the admission filter guards */
    size_t nucx_lfds;
    gux_allow_t *allow;       /* addresses the filter lets through */
    size_t nallow, allow_cap;
    bool filter_off;          /* GSER_UCX_FILTER=0 */

    /* resolved options */
    gser_context_t *gser_ctx;
    bool have_device;
    size_t max_frames;
    uint64_t max_bytes;
    size_t inline_max;
    size_t inline_budget;
    size_t chunk;
    unsigned depth;
    uint32_t announce_version;
    uint32_t mm_fifo;         /* the shared-memory FIFO size of ucp_ctx, in its hellos */
    uint32_t announce_codecs; /* GSER_UCX_CAP_LZ4/_ZSTD this worker announces and reads */
    uint32_t announce_gser_version; /* GSER_WIRE_VERSION (tests: an older peer's) */
    int compression;          /* gser_ucx_compression_t of its endpoints */
    int compression_level;
    bool announce_chunked;    /* GSER_UCX_CAP_CHUNKED in its hellos (tests turn it off) */
    size_t zchunk_min;        /* frames from this size go in compressed chunks (SIZE_MAX: never) */
    size_t zchunk;            /* bytes per compressed chunk */
    gux_link_host_t link_hosts[GUX_LINK_HOSTS]; /* link.c */
    gux_pool_t *pool; /* cache of host receive buffers */

    gux_list_t eps;       /* every endpoint (gser_ucx_ep_t.wlink) */
    gux_list_t listeners; /* gser_ucx_listener_t.wlink */
    gux_list_t recvs;     /* receives waiting for a head, oldest first (req.wlink) */
    gux_list_t ready;     /* requests whose UCX parts finished (req.rlink) */
    gux_list_t done;      /* requests whose user callback is due (req.wlink) */
    gux_list_t all;       /* every request not yet freed (req.alink) */
    bool eps_dirty;       /* an endpoint has an error or handshake event to handle */

    gux_slots_t conn_ids; /* endpoints by connection id */

    /* probe.c: the receive queue checked after a peer died */
    gux_probe_t probe;
    bool probe_fault;          /* tests: the check's message never arrives */
    gser_status_t broken;      /* not GSER_OK: the worker failed for good (probe.c) */
    char broken_why[512];

    gser_ucx_request_t **req_cache; /* freed requests, for reuse */
    size_t nreq_cache;
    unsigned events;      /* handled since the last progress call returned */
    bool in_completions;  /* running user callbacks */
    gux_staging_t *staging;
};

typedef enum gux_ep_state {
    GUX_EP_CONNECTING = 0,
    GUX_EP_READY = 1,
    GUX_EP_FAILED = 2, /* by the peer, the network, a bad message or a version mismatch */
    GUX_EP_CLOSED = 3, /* by this side */
} gux_ep_state_t;

struct gser_ucx_ep {
    gser_ucx_worker_t *worker;
    ucp_ep_h ucp; /* NULL before the handshake's end and once closed */
    void *close_req; /* ucp_ep_close_nbx still running */
    /* UCX's endpoint goes in steps (endpoint.c, ep_ucp_release): wanted
     * closed; then, once UCX gave back every send and no message of the
     * peer came for a while, flushed; then closed. */
    bool ucp_release;
    void *flush_req;  /* the flush before the close */
    bool ucp_flushed; /* ... done (or failed: UCX failed the endpoint) */
    double last_purge; /* when a message of the peer was last discarded */
    double flush_started;
    bool lanes_known, on_tcp; /* UCX connected it through tcp (endpoint.c, ep_on_tcp) */
    bool fifo_checked;        /* its lanes were checked against the peer's FIFO size (endpoint.c, fifo_check) */
    bool drain;      /* failed by the peer: messages that fully arrived are still delivered */
    double lost_at;  /* the peer left (control connection): close UCX's endpoint when UCX sees it, or later */
    /* The peer closed after sending peer_sent messages whole (its bye):
     * those are delivered, in order, before the close is reported, and no
     * later one is. Until drain_until (0: not waiting) UCX's endpoint stays
     * open for what of them is still on the way. */
    bool peer_sent_known;
    uint32_t peer_sent;
    double drain_until;
    uint32_t heads;   /* message heads taken off UCX's queue: the next one's number */
    uint64_t ucp_closed_round; /* w->rounds when UCX's endpoint was closed */
    uint32_t local_id;
    uint32_t peer_id;
    gux_ep_state_t state;
    gser_status_t error; /* why it failed or closed */
    char why[256];       /* ... in words, for whatever ends with it */
    gser_ucx_peer_info_t peer;
    bool compression_set;     /* gser_ucx_ep_set_compression overrides the worker's */
    int compression;
    uint32_t send_seq;
    /* A short head found UCX's queue to the peer full: the next ones are
     * posted, not tried at once, until a posted send completes. */
    bool short_queued;
    uint32_t recv_seq;
    gser_ucx_chunk_stats_t zstats; /* compressed chunks sent and received */
    gux_link_t link;               /* link-aware compression (link.c) */
    gux_list_t reqs;  /* requests in flight on it (req.elink) */
    gux_list_t wlink; /* in worker->eps */

    /* accepted by a listener, not yet handed to the caller */
    gser_ucx_listener_t *listener;
    gux_list_t alink;

    gux_ctl_t ctl;    /* the control connection */
    unsigned char allowed[(GUX_SETUP_IPS_MAX + 1) * GUX_IP_LEN]; /* the peer's addresses in the filter */
    size_t nallowed;
    void *wireup_req; /* the flush that tells when UCX has connected it */
    bool wired;       /* ... done */
    bool peer_ready;  /* the client: the server's endpoint is connected too (ready record) */
    bool peer_known;  /* the peer's hello arrived */
    bool admitting;   /* admitted by its listener, handshake not done: counts in listener->nadmitting */
    bool hs_reported; /* the listener reported this endpoint's outcome */

    /* reported by UCX's error handler, handled in progress */
    bool ucx_failed;
    ucs_status_t ucx_error;
    bool user_owned; /* handed to the caller (connect or accept) */
    bool zombie;     /* destroyed by the caller while UCX still held parts of it */
};

/* A handshake's failure as its listener reports it: the status and why. */
typedef struct gux_failure {
    gser_status_t st;
    char why[256];
} gux_failure_t;

struct gser_ucx_listener {
    gser_ucx_worker_t *worker;
    gux_io_t io; /* the listening socket */
    uint16_t port;
    gser_ucx_accept_fn cb;
    void *user_data;
    gux_list_t accepted; /* ready endpoints (ep.alink) */
    gux_list_t pending;  /* handshakes before admission (gux_pconn_t.link), oldest first */
    size_t npending;
    size_t nadmitting; /* admitted endpoints whose handshake runs: with npending, at most GUX_MAX_PENDING */
    double resume_at; /* out of file descriptors: accept again then (0: not resting) */
    gser_ucx_listener_stats_t stats;
    gux_failure_t *failures; /* handshake failures not yet reported */
    size_t nfailures, failures_cap;
    gux_list_t wlink;
};

typedef enum gux_req_kind { GUX_REQ_SEND = 0, GUX_REQ_RECV = 1 } gux_req_kind_t;

typedef enum gux_recv_stage {
    GUX_RECV_WAIT_HEAD = 0, /* in worker->recvs, probing */
    GUX_RECV_HEAD = 1,      /* head matched, its data on the way */
    GUX_RECV_FRAMES = 2,    /* frames on the way */
    GUX_RECV_DISCARD = 3,   /* receiving the head of a message nobody wants */
} gux_recv_stage_t;

typedef struct gux_stage_op gux_stage_op_t;

struct gser_ucx_request {
    gux_req_kind_t kind;
    gser_ucx_worker_t *worker;
    gser_ucx_ep_t *ep;
    gser_status_t status; /* GSER_INPROGRESS until the caller sees it complete */
    gser_ucx_complete_fn cb;
    void *user_data;
    bool user_holds; /* the caller has the handle and has not freed it */
    bool in_cb;
    bool cb_queued;
    bool any; /* receive from any endpoint */
    gux_recv_stage_t stage;

    unsigned outstanding; /* UCX operations and staging copies not finished */
    bool posting;         /* still issuing parts: completion waits for the end */
    ucs_status_t first_error;
    gser_status_t fail_status; /* set when the request must end in an error */

    gux_list_t elink; /* in ep->reqs while in flight */
    gux_list_t wlink; /* in worker->recvs or worker->done */
    gux_list_t rlink; /* in worker->ready */
    gux_list_t alink; /* in worker->all */
    uint32_t msg_no;  /* the message's number on its endpoint (not wrapped at 2^28, as seq is) */
    uint64_t head_round; /* worker->rounds when its head was taken */

    /* send */
    const gser_frame_t *sframes; /* copy of the frames, when some are staged */
    uint8_t *routes;
    unsigned char *head;
    size_t head_len;
    uint32_t seq;
    int zcodec, zlevel; /* route 3's codec (GSER_COMPRESSION_*) and level */
    size_t link_bytes;  /* bytes of its timed sends (link.c) ... */
    unsigned link_parts; /* ... and how many */
    size_t link_whole;   /* timed as one send of this many bytes (none of its sends is large enough alone) */
    uint64_t link_run;   /* the codec run it joined (link.c; 0: none) */

    /* receive */
    bool short_head;      /* the head is of the short form (GUX_KIND_SHORT) */
    unsigned char *rhead; /* received head: frame 0 and inlined frames point into it */
    bool rhead_pooled;    /* rhead is a buffer of GUX_HEAD_POOLED bytes (recv.c) */
    size_t rhead_len;
    gux_head_frame_t *table;
    uint32_t chunk; /* staging chunk of the message */
    gser_frame_t *frames;
    size_t nframes;
    void **ucx_reqs; /* frame receives, for canceling */
    size_t nucx_reqs, ucx_reqs_cap;
    bool taken; /* frames handed to the caller */
    uint32_t read_codecs; /* the worker's announced codecs when it was posted (read off its thread) */

    /* staging of device frames, one frame at a time, in frame order */
    gux_stage_op_t *stage_op;
    size_t stage_next; /* next frame index to look at */

    gux_head_frame_t table_inline[GUX_FRAMES_INLINE];
    gser_frame_t frames_inline[GUX_FRAMES_INLINE];
    unsigned char head_inline[GUX_HEAD_INLINE];
    /* why fail_status, when it was set where the thread's message may change
     * before it is used (a compressed chunk); past the zeroed part */
    char fail_why[256];
};

/* ---- worker internals (worker.c) ------------------------------------------------- */

/* The worker's lock, taken only by a worker made for many threads: inline,
 * since every call takes it and most workers have one thread. */
static inline void gux_lock(gser_ucx_worker_t *w)
{
    if (w->mt)
        pthread_mutex_lock(&w->lock);
}
static inline void gux_unlock(gser_ucx_worker_t *w)
{
    if (w->mt)
        pthread_mutex_unlock(&w->lock);
}
/* One round: UCX progress, then the queued work. Lock held. */
GUX_INTERNAL unsigned gux_progress(gser_ucx_worker_t *w);
/* Progress until done(arg) or the timeout (-1: none). GSER_OK or GSER_ERR_TIMEOUT. Lock held. */
GUX_INTERNAL gser_status_t gux_wait(gser_ucx_worker_t *w, bool (*done)(void *arg), void *arg, int timeout_ms);
/* The monotonic clock, in milliseconds (slots.c, a leaf). */
GUX_INTERNAL double gux_now_ms(void);

/* Create the worker's UCX worker if it has none yet. listen: the address
 * it is about to listen on (its network device is then the only one UCX
 * uses, unless the context or UCX_NET_DEVICES names devices), or NULL. */
GUX_INTERNAL gser_status_t gux_worker_ucx(gser_ucx_worker_t *w, const struct sockaddr *listen);
/* Add fd to the worker's epoll set (io->events) or change what it waits for. */
GUX_INTERNAL gser_status_t gux_io_watch(gser_ucx_worker_t *w, gux_io_t *io, uint32_t events);
/* Take fd off the epoll set, close it and free io's id. */
GUX_INTERNAL void gux_io_close(gser_ucx_worker_t *w, gux_io_t *io);

/* ---- control connections (control.c) --------------------------------------------------- */

/* Accept, read and write what the sockets have; run due timers. Lock held. */
GUX_INTERNAL unsigned gux_ctl_progress(gser_ucx_worker_t *w);
/* Arm the timer for the earliest deadline. */
GUX_INTERNAL void gux_ctl_arm_timer(gser_ucx_worker_t *w);
/* Listen on sa (the listener's io is set up). */
GUX_INTERNAL gser_status_t gux_ctl_listen(gser_ucx_listener_t *l, const struct sockaddr *sa, socklen_t len);
/* Drop a listener's pending handshakes and close its socket. */
GUX_INTERNAL void gux_ctl_unlisten(gser_ucx_listener_t *l);
/* Start the client side of a control connection for ep. */
GUX_INTERNAL gser_status_t gux_ctl_connect(gser_ucx_ep_t *ep, const struct sockaddr *sa, socklen_t len,
                                           const char *name);
/* Read what ep's control connection holds now (a bye may say why UCX
 * reports the peer gone). */
GUX_INTERNAL void gux_ctl_read_now(gser_ucx_ep_t *ep);
/* The listening side's endpoint is connected: tell the client. */
GUX_INTERNAL gser_status_t gux_ctl_ready(gser_ucx_ep_t *ep);
/* GSER_ERR_WIRE_VERSION with the words for a peer of another shared-memory
 * FIFO size; tl: the shared-memory transport of ep's lanes (NULL: not told). */
GUX_INTERNAL gser_status_t gux_fifo_mismatch(const gser_ucx_ep_t *ep, const char *tl);
/* Close ep's control connection; reason (GUX_BYE_*, 0: none) and value go
 * to the peer in a bye when the connection is open. */
GUX_INTERNAL void gux_ctl_close(gser_ucx_ep_t *ep, unsigned reason, uint64_t value);

/* ---- the admission filter on UCX's ports (filter.c) ------------------------------------------ */

/* Around ucp_worker_create: note the listening sockets before (and hold
 * other gser workers off), then guard the ones UCX opened (w->ucp and its
 * address set; or NULL when creating it failed: only lets go). */
GUX_INTERNAL void *gux_filter_before(void);
GUX_INTERNAL void gux_filter_after(gser_ucx_worker_t *w, void *snapshot);
/* Put the current list of allowed addresses on UCX's listening sockets. */
GUX_INTERNAL void gux_filter_apply(gser_ucx_worker_t *w);
/* Let n addresses (GUX_IP_LEN bytes each) through for ep; let go of them
 * when the endpoint goes. */
GUX_INTERNAL gser_status_t gux_filter_allow(gser_ucx_ep_t *ep, const unsigned char *ips, size_t n);
GUX_INTERNAL void gux_filter_release(gser_ucx_ep_t *ep);
/* sa's address as GUX_IP_LEN bytes (IPv4 as ::ffff:a.b.c.d); false for
 * another family. */
GUX_INTERNAL bool gux_ip_of(const struct sockaddr_storage *sa, unsigned char out[GUX_IP_LEN]);
/* This host's addresses (not loopback or link-local), at most cap. */
GUX_INTERNAL size_t gux_local_ips(unsigned char *out, size_t cap);

/* ---- endpoints (endpoint.c) ----------------------------------------------------------- */

GUX_INTERNAL gser_ucx_ep_t *gux_ep_lookup(gser_ucx_worker_t *w, uint32_t id);
GUX_INTERNAL gser_status_t gux_ep_new(gser_ucx_worker_t *w, gser_ucx_ep_t **out);
/* The peer's setup arrived: create the UCX endpoint from its worker address. */
GUX_INTERNAL gser_status_t gux_ep_ucx_connect(gser_ucx_ep_t *ep, const void *addr);
/* Handle errors and handshake events UCX reported. */
GUX_INTERNAL void gux_eps_process(gser_ucx_worker_t *w);
/* ep's handshake is over (done, failed, or its listener gone): it no
 * longer counts against its listener's handshakes. */
GUX_INTERNAL void gux_ep_admitted(gser_ucx_ep_t *ep);
/* A listener's handshake failed before an endpoint existed: report st once. */
GUX_INTERNAL void gux_listener_failure(gser_ucx_listener_t *l, gser_status_t st, const char *why);
/* The status for a UCX operation of ep that ended with st (recorded). */
GUX_INTERNAL gser_status_t gux_ep_part_error(gser_ucx_ep_t *ep, ucs_status_t st, const char *what);
/* Fail ep with st (the thread's last message says why, and is kept in
 * ep->why); cancels what is in flight on it. */
GUX_INTERNAL void gux_ep_fail(gser_ucx_ep_t *ep, gser_status_t st);
/* The same, telling the peer bye (GUX_BYE_*) and value. */
GUX_INTERNAL void gux_ep_fail_bye(gser_ucx_ep_t *ep, gser_status_t st, unsigned bye, uint64_t value);
/* The peer left (its control connection ended or said bye): fail ep with
 * st, saying nothing back. */
GUX_INTERNAL void gux_ep_lost(gser_ucx_ep_t *ep, gser_status_t st);
/* probe.c: start checking the worker's receive queue (a peer died); the
 * check's deadline, INFINITY when none runs (the worker may fail for good
 * in it); teardown before UCX's worker goes. */
GUX_INTERNAL void gux_probe_start(gser_ucx_worker_t *w);
GUX_INTERNAL double gux_probe_timer(gser_ucx_worker_t *w, double now);
GUX_INTERNAL void gux_probe_close(gser_ucx_worker_t *w);
/* How many messages went out whole on ep: those before the first send
 * still in flight (it and later ones are canceled when ep closes). */
GUX_INTERNAL uint32_t gux_ep_sent_whole(const gser_ucx_ep_t *ep);
/* Close ep from this side with st as its status; cancels what is in flight. */
GUX_INTERNAL void gux_ep_shutdown(gser_ucx_ep_t *ep, gser_status_t st);
/* Worker teardown, once the wait for the steps of endpoint.c ran out
 * (a peer that stays stopped): close UCX's endpoint now, whatever it still
 * runs (docs/ucx.md says what this risks on UCX's tcp transport). */
GUX_INTERNAL void gux_ep_ucp_drop(gser_ucx_ep_t *ep);
GUX_INTERNAL void gux_ep_free(gser_ucx_ep_t *ep);

/* ---- requests (request.c, send.c, recv.c) --------------------------------------------- */

GUX_INTERNAL gser_ucx_request_t *gux_req_new(gser_ucx_worker_t *w, gux_req_kind_t kind, gser_ucx_ep_t *ep,
                                             const gser_ucx_op_params_t *params, bool user_holds);
/* The request is over for the caller: record st, queue its callback. */
GUX_INTERNAL void gux_req_complete(gser_ucx_request_t *req, gser_status_t st);
/* Free it if nobody (caller, UCX, callback queue) refers to it any more. */
GUX_INTERNAL void gux_req_release_if_idle(gser_ucx_request_t *req);
/* Track a UCX operation started for req: NULL (done at once), a request, or an error. */
GUX_INTERNAL gser_status_t gux_req_track(gser_ucx_request_t *req, ucs_status_ptr_t sp, const char *what,
                                         bool cancelable);
/* A part of req finished (from a UCX callback or a staging step). */
GUX_INTERNAL void gux_req_part_done(gser_ucx_request_t *req, ucs_status_t st);
/* Run queued work of requests whose parts finished. */
GUX_INTERNAL void gux_ready_process(gser_ucx_worker_t *w);
/* Run due user callbacks. */
GUX_INTERNAL void gux_completions_run(gser_ucx_worker_t *w);
/* Abort req because its endpoint failed or closed: cancel its receives and
 * complete it with st (a send completes once UCX gave its buffers back). */
GUX_INTERNAL void gux_req_abort(gser_ucx_request_t *req, gser_status_t st);

/* UCX callbacks shared by the operations. */
GUX_INTERNAL void gux_send_cb(void *ucx_req, ucs_status_t st, void *user_data);
GUX_INTERNAL void gux_recv_cb(void *ucx_req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *user_data);

/* The parameters of a tagged receive into memory of kind mem that ends in
 * cb(user_data); *imm takes the tag info when it completes at once. */
static inline ucp_request_param_t gux_recv_param(ucp_tag_recv_nbx_callback_t cb, void *user_data,
                                                 ucs_memory_type_t mem, ucp_tag_recv_info_t *imm)
{
    ucp_request_param_t p; /* assigned field by field: C++ tests include this header */
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO |
                     UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.cb.recv = cb;
    p.user_data = user_data;
    p.memory_type = mem;
    p.recv_info.tag_info = imm;
    return p;
}

/* recv.c */
GUX_INTERNAL unsigned gux_recvs_match(gser_ucx_worker_t *w);
/* Take the messages UCX holds whose tags match tag under mask off its queue,
 * unread: an endpoint's that is gone, or all when the worker goes (UCX keeps
 * them until its worker ends, and warns about each then). How many. */
GUX_INTERNAL unsigned gux_recv_purge(gser_ucx_worker_t *w, uint64_t tag, uint64_t mask);
GUX_INTERNAL void gux_recv_ready(gser_ucx_request_t *req);
/* Release received frame memory not handed to the caller. */
GUX_INTERNAL void gux_recv_release(gser_ucx_request_t *req);

/* send.c */
GUX_INTERNAL void gux_send_ready(gser_ucx_request_t *req);

/* ---- device staging (staging.c) -------------------------------------------------------- */

GUX_INTERNAL gser_status_t gux_staging_create(gser_ucx_worker_t *w);
GUX_INTERNAL void gux_staging_destroy(gser_ucx_worker_t *w);
/* Start or advance the staged frames of req (send or receive). GSER_OK when
 * every staged frame is done, GSER_INPROGRESS while some are running. */
GUX_INTERNAL gser_status_t gux_staging_advance(gser_ucx_request_t *req);
/* Advance all staging in flight (copies finishing, buffers freed). */
GUX_INTERNAL unsigned gux_staging_progress(gser_ucx_worker_t *w);
/* Whether a staging copy is running: its end does not show on the event fd. */
GUX_INTERNAL bool gux_staging_copying(const gser_ucx_worker_t *w);
/* Stop issuing chunks of req and take back its chunk receives; the staging
 * part finishes once the copies in flight are done. */
GUX_INTERNAL void gux_staging_abort(gser_ucx_request_t *req);
/* The endpoint of send req is closed: give up its chunk sends UCX kept. */
GUX_INTERNAL void gux_staging_abandon(gser_ucx_request_t *req);
/* Drop req's staging state (after completion or abort). */
GUX_INTERNAL void gux_staging_release(gser_ucx_request_t *req);

/* Device memory for a received frame, from the gser context's allocator. */
GUX_INTERNAL gser_status_t gux_staging_device_frame(gser_ucx_worker_t *w, size_t size, int32_t device,
                                                    gser_frame_t *out);
/* The cache of host receive buffers (pool.c). */
GUX_INTERNAL gux_pool_t *gux_pool_create(size_t max_cached, size_t grow_max);
/* A message of bytes host frames is coming: let the cache hold that much
 * (up to its grow_max). */
GUX_INTERNAL void gux_pool_expect(gux_pool_t *p, size_t bytes);
GUX_INTERNAL void gux_pool_stats(gux_pool_t *p, gser_ucx_cache_stats_t *out);
/* The worker lets go; buffers still out come back to nothing. NULL is fine. */
GUX_INTERNAL void gux_pool_close(gux_pool_t *p);
/* A host frame of size bytes (64-byte aligned) whose release returns it to p. */
GUX_INTERNAL gser_status_t gux_pool_frame(gux_pool_t *p, size_t size, gser_frame_t *out);
/* Memory for received frames. */
GUX_INTERNAL gser_status_t gux_frame_alloc(gser_ucx_worker_t *w, size_t size, gser_memory_t *memory, int32_t device,
                                           gser_frame_t *out);

#endif /* GSER_UCX_INTERNAL_H */
