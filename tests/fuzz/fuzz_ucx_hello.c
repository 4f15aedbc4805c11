/* libFuzzer target: the handshake a gser UCX listener runs before it admits
 * a peer (docs/ucx.md section 2). Each input is what a client sends. It is
 * written into one end of a socketpair whose other end a real listener
 * takes as an accepted connection (gser_ucx_listener_adopt), then that end
 * hangs up; the listener's worker is driven until the handshake is over.
 * The listener's context holds a shared secret, so no input can prove it:
 * whatever the bytes, the connection must end (refused, failed or timed
 * out) without being admitted, and without a crash, a leak, or a read out
 * of bounds. The decoders of the records that follow a hello run on the
 * input too. Seeds: tests/fuzz/corpus-ucx-hello (make_corpus). */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gser/extension.h>
#include <gser/testing.h>
#include <gser/ucx.h>

#include "plugins/ucx/wire.h"

static gser_ucx_context_t *g_ctx;
static gser_ucx_worker_t *g_worker;
static gser_ucx_listener_t *g_listener;
static volatile unsigned sink;

static void stats(gser_ucx_listener_stats_t *s)
{
    gser_ucx_listener_stats_t t = GSER_UCX_LISTENER_STATS_INIT;
    if (gser_ucx_listener_get_stats(g_listener, &t) != GSER_OK)
        abort();
    *s = t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("UCX_TLS", "tcp", 0);
    setenv("UCX_NET_DEVICES", "lo", 0);
    gser_ucx_context_options_t co = GSER_UCX_CONTEXT_OPTIONS_INIT;
    co.secret = "the fuzzer does not know it";
    co.peer_timeout_ms = 2000;
    gser_ucx_listener_options_t lo = GSER_UCX_LISTENER_OPTIONS_INIT;
    lo.address = "127.0.0.1";
    if (gser_ucx_context_create(&co, &g_ctx) || gser_ucx_worker_create(g_ctx, NULL, &g_worker) ||
        gser_ucx_listener_create(g_worker, &lo, &g_listener)) {
        fprintf(stderr, "fuzz_ucx_hello: setup failed: %s\n", gser_ucx_get_last_error());
        abort();
    }
    return 0;
}

/* The records after a hello, through the pure decoders. */
static void records(const uint8_t *data, size_t size)
{
    gux_hello_t h;
    if (size < GUX_HELLO_LEN || gux_hello_decode(data, &h) != GSER_OK)
        return;
    sink += h.wire_version + h.flags + h.timeout_ms;
    const unsigned all = 1u << GUX_REC_PROOF | 1u << GUX_REC_SETUP | 1u << GUX_REC_HEARTBEAT | 1u << GUX_REC_BYE |
                         1u << GUX_REC_READY;
    for (size_t off = GUX_HELLO_LEN; size - off >= GUX_REC_LEN;) {
        gux_rec_t r;
        if (gux_rec_decode(data + off, all, &r) != GSER_OK)
            return;
        off += GUX_REC_LEN;
        if (r.len > size - off)
            return;
        if (r.type == GUX_REC_SETUP) {
            gux_setup_t su;
            if (gux_setup_decode(data + off, r.len, &su) == GSER_OK) {
                const uint8_t *end = data + off + r.len;
                if (su.addr < data + off || su.addr_len == 0 || su.addr_len > (size_t)(end - su.addr) ||
                    su.ips < data + off || su.nips * GUX_IP_LEN > (size_t)(su.addr - su.ips))
                    abort(); /* a part said to lie outside the record */
                sink += su.conn_id + su.addr[su.addr_len - 1] + (su.nips ? su.ips[0] : 0);
            }
        }
        off += r.len;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    records(data, size);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        abort();
    gser_ucx_listener_stats_t before, after;
    stats(&before);
    if (gser_ucx_listener_adopt(g_listener, sv[0]) != GSER_OK)
        abort();
    /* Inputs are small (-max_len): the socket buffer takes them whole. */
    if (size && write(sv[1], data, size) != (ssize_t)size)
        abort();
    shutdown(sv[1], SHUT_WR);
    char buf[4096];
    for (int round = 0;; round++) {
        gser_ucx_worker_progress(g_worker);
        while (recv(sv[1], buf, sizeof buf, MSG_DONTWAIT) > 0)
            sink += (unsigned char)buf[0];
        stats(&after);
        if (after.pending == 0)
            break;
        if (round > 100000) {
            fprintf(stderr, "fuzz_ucx_hello: a handshake that read its client's end of file did not end\n");
            abort();
        }
    }
    close(sv[1]);
    /* Past the pending stage only with the secret's proof, which no input has. */
    for (;;) {
        gser_ucx_ep_t *ep = NULL;
        gser_status_t st = gser_ucx_listener_accept(g_listener, 0, &ep);
        if (st == GSER_ERR_TIMEOUT)
            break;
        if (st == GSER_OK || ep || !gser_ucx_status_is_peer_error(st))
            abort();
    }
    if (after.accepted != before.accepted)
        abort();
    uint64_t ended = (after.refused - before.refused) + (after.failed - before.failed) +
                     (after.timed_out - before.timed_out) + (after.evicted - before.evicted);
    if (ended != 1)
        abort(); /* every connection ends once, and is counted once */
    return 0;
}
