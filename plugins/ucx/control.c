/* Control connections: a TCP connection that gser owns beside every UCX
 * endpoint (docs/ucx.md section 2).
 *
 * gser listens itself, so that no byte from an unknown peer reaches UCX:
 * a connection first sends a fixed-size hello, read under a deadline; with a
 * shared secret each side then proves it holds it; only then do the sides
 * swap UCX worker addresses and make their UCX endpoints from them. Until
 * that point a listener's connections are light records of their own
 * (gux_pconn_t), at most GUX_MAX_PENDING at once, the oldest dropped for a
 * new one. Afterwards the connection carries heartbeats, so that a peer that
 * goes silent (stopped, hung, cut off) is failed in bounded time, and a bye
 * saying why a side let go. Its end of file tells of a dead process at once.
 *
 * Everything here runs from gux_progress with the worker's lock held, on
 * non-blocking sockets in the worker's epoll set, never from a UCX callback. */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include "internal.h"

/* Epoll tags that are not in the worker's io table. */
#define GUX_TAG_UCX ((uint64_t)1 << 40)
#define GUX_TAG_TIMER ((uint64_t)2 << 40)
/* Connections taken from a listener's queue per round (the rest wait). */
#define GUX_ACCEPT_BATCH 32
/* How long a listener rests after running out of file descriptors. */
#define GUX_EMFILE_PAUSE_MS 100

static gux_ctl_t *ctl_of(gux_io_t *io)
{
    return gux_container(io, gux_ctl_t, io);
}

static gux_pconn_t *pconn_of(gux_ctl_t *c)
{
    return gux_container(c, gux_pconn_t, ctl);
}

static gser_ucx_ep_t *ep_of(gux_ctl_t *c)
{
    return gux_container(c, gser_ucx_ep_t, ctl);
}

static void timer_at(gser_ucx_worker_t *w, double when)
{
    if (when < w->timer_next)
        w->timer_next = when;
}

static void sa_name(const struct sockaddr_storage *sa, char *out, size_t n)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &s->sin6_addr, ip, sizeof ip);
        port = ntohs(s->sin6_port);
        snprintf(out, n, "[%s]:%u", ip, port);
        return;
    }
    if (sa->ss_family != AF_INET) {
        snprintf(out, n, "a peer of address family %d", sa->ss_family);
        return;
    }
    const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
    inet_ntop(AF_INET, &s->sin_addr, ip, sizeof ip);
    port = ntohs(s->sin_port);
    snprintf(out, n, "%s:%u", ip, port);
}

/* ---- the io table and the epoll set ----------------------------------------------------- */

static gser_status_t io_open(gser_ucx_worker_t *w, gux_io_t *io, int fd, gux_io_kind_t kind, uint32_t events)
{
    io->fd = -1; /* until it is in: the caller closes fd on failure */
    io->kind = kind;
    io->events = 0;
    gser_status_t st = gux_slot_take(&w->io, io, &io->id);
    if (st)
        return st;
    struct epoll_event ev = {.events = events, .data.u64 = io->id};
    if (epoll_ctl(w->efd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        gux_slot_put(&w->io, io->id);
        return gux_fail(GSER_ERR_IO, "epoll_ctl: %s", strerror(errno));
    }
    io->fd = fd;
    io->events = events;
    return GSER_OK;
}

gser_status_t gux_io_watch(gser_ucx_worker_t *w, gux_io_t *io, uint32_t events)
{
    if (io->fd < 0 || io->events == events)
        return GSER_OK;
    struct epoll_event ev = {.events = events, .data.u64 = io->id};
    if (epoll_ctl(w->efd, EPOLL_CTL_MOD, io->fd, &ev) != 0)
        return gux_fail(GSER_ERR_IO, "epoll_ctl: %s", strerror(errno));
    io->events = events;
    return GSER_OK;
}

void gux_io_close(gser_ucx_worker_t *w, gux_io_t *io)
{
    if (io->fd < 0)
        return;
    epoll_ctl(w->efd, EPOLL_CTL_DEL, io->fd, NULL);
    close(io->fd);
    gux_slot_put(&w->io, io->id);
    io->fd = -1;
    io->id = 0;
    io->events = 0;
}

/* ---- writing ------------------------------------------------------------------------------ */

/* Queue a+b on the connection: written now as far as the socket takes it,
 * the rest when it becomes writable. */
static gser_status_t ctl_send(gser_ucx_worker_t *w, gux_ctl_t *c, const void *a, size_t alen, const void *b,
                              size_t blen)
{
    size_t done = 0;
    if (c->out_len == c->out_off) {
        struct iovec iov[2] = {{(void *)a, alen}, {(void *)b, blen}};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = blen ? 2 : 1};
        ssize_t n;
        do
            n = sendmsg(c->io.fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return gux_fail(GSER_ERR_CONNECTION, "control connection to %s: %s", c->peer_name, strerror(errno));
        done = n > 0 ? (size_t)n : 0;
        if (done == alen + blen)
            return GSER_OK;
    }
    /* Keep what is left (records are small; a setup record holds at most
     * one worker address). */
    size_t left = alen + blen - done;
    size_t keep = c->out_len - c->out_off;
    unsigned char *o = malloc(keep + left);
    if (!o)
        return gux_fail(GSER_ERR_NO_MEMORY, "control connection: out of memory");
    if (keep)
        memcpy(o, c->out + c->out_off, keep);
    for (size_t i = done; i < alen + blen; i++)
        o[keep + i - done] = i < alen ? ((const unsigned char *)a)[i] : ((const unsigned char *)b)[i - alen];
    free(c->out);
    c->out = o;
    c->out_off = 0;
    c->out_len = keep + left;
    return gux_io_watch(w, &c->io, c->io.events | EPOLLOUT);
}

static gser_status_t ctl_flush(gser_ucx_worker_t *w, gux_ctl_t *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->io.fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return GSER_OK;
        if (n < 0)
            return gux_fail(GSER_ERR_CONNECTION, "control connection to %s: %s", c->peer_name, strerror(errno));
        c->out_off += (size_t)n;
    }
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_off = 0;
    return gux_io_watch(w, &c->io, c->io.events & ~(uint32_t)EPOLLOUT);
}

static gser_status_t ctl_send_rec(gser_ucx_worker_t *w, gux_ctl_t *c, unsigned type, unsigned reason, const void *body,
                                  size_t len)
{
    unsigned char h[GUX_REC_LEN];
    gux_rec_t r = {.type = (uint16_t)type, .reason = (uint16_t)reason, .len = (uint32_t)len};
    gux_rec_encode(&r, h);
    return ctl_send(w, c, h, sizeof h, body, len);
}

static gser_status_t ctl_send_bye(gser_ucx_worker_t *w, gux_ctl_t *c, unsigned reason, uint64_t value)
{
    unsigned char v[GUX_BYE_LEN];
    for (int i = 0; i < GUX_BYE_LEN; i++)
        v[i] = (unsigned char)(value >> (8 * i));
    return ctl_send_rec(w, c, GUX_REC_BYE, reason, v, sizeof v);
}

/* ---- reading ------------------------------------------------------------------------------ */

/* Read a unit of n bytes next: a hello, a record header, or a body. */
static gser_status_t ctl_expect(gux_ctl_t *c, size_t n, bool body)
{
    free(c->body);
    c->body = NULL;
    c->have = 0;
    c->need = n;
    c->in_body = body;
    if (n <= sizeof c->in) {
        c->dst = c->in;
        return GSER_OK;
    }
    if (!(c->body = malloc(n)))
        return gux_fail(GSER_ERR_NO_MEMORY, "control connection: out of memory for %zu bytes", n);
    c->dst = c->body;
    return GSER_OK;
}

/* Read what the socket has of the current unit, never past it (the bytes
 * after it stay in the socket). 1: the unit is complete; 0: it would block;
 * -1: the connection ended (*st and the message say how). */
static int ctl_fill(gux_ctl_t *c, gser_status_t *st)
{
    while (c->have < c->need) {
        ssize_t n = recv(c->io.fd, c->dst + c->have, c->need - c->have, MSG_DONTWAIT);
        if (n > 0) {
            c->have += (size_t)n;
            c->last_rx = gux_now_ms();
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        *st = gux_fail(GSER_ERR_CONNECTION, "control connection to %s: %s", c->peer_name,
                       n == 0 ? "the peer closed it" : strerror(errno));
        return -1;
    }
    return 1;
}

/* ---- hellos and proofs ----------------------------------------------------------------------- */

static unsigned ctl_timeout(const gser_ucx_worker_t *w)
{
    return w->ctx->timeout_ms;
}

static gser_status_t hello_make(gser_ucx_worker_t *w, gux_ctl_t *c)
{
    gux_hello_t h = {.wire_version = w->announce_version,
                     .gser_wire_version = w->announce_gser_version,
                     .caps = (w->ctx->caps & ~(uint32_t)(GUX_CODECS | GSER_UCX_CAP_CHUNKED)) | w->announce_codecs |
                             (w->announce_chunked ? GSER_UCX_CAP_CHUNKED : 0),
                     .flags = w->ctx->secret ? GUX_HELLO_SECRET : 0,
                     .timeout_ms = ctl_timeout(w),
                     .mm_fifo = w->mm_fifo};
    gser_status_t st = gux_nonce(h.nonce);
    if (st)
        return st;
    gux_hello_encode(&h, c->hello_mine);
    return GSER_OK;
}

/* Whether the peer's hello is one this side can go on with: versions and
 * the secret. The message names what differs. */
static gser_status_t hello_check(gser_ucx_worker_t *w, const gux_hello_t *h, bool server)
{
    /* A peer's gser wire version may be 2 (it reads no compressed frame) up
     * to this side's: each side writes only what both read, and version 3
     * differs from 2 only in compressed frames, which go only to a peer
     * that announced their codec (docs/ucx.md section 4.5). */
    if (h->wire_version != w->announce_version || h->gser_wire_version < 2 || h->gser_wire_version > GSER_WIRE_VERSION)
        return gux_fail(GSER_ERR_WIRE_VERSION,
                        "handshake: the peer speaks transport wire version %u and gser wire version %u, "
                        "this side %u and 2 to %u: refused (the two sides need gser releases of one transport "
                        "wire version)",
                        h->wire_version, h->gser_wire_version, w->announce_version, GSER_WIRE_VERSION);
    bool peer_secret = (h->flags & GUX_HELLO_SECRET) != 0, mine = w->ctx->secret != NULL;
    if (peer_secret && !mine)
        return gux_fail(GSER_ERR_ACCESS,
                        "handshake: the %s proves a shared secret and this side has none "
                        "(gser_ucx_context_options_t.secret or " GSER_UCX_SECRET_ENV ")",
                        server ? "client" : "server");
    if (!peer_secret && mine)
        return gux_fail(GSER_ERR_ACCESS, "handshake: the %s does not prove the shared secret: refused",
                        server ? "client" : "server");
    return GSER_OK;
}

/* This side's proof for the connection, or the one expected from the peer. */
static void proof_of(gser_ucx_worker_t *w, gux_ctl_t *c, bool server_role, unsigned char out[GUX_MAC_LEN])
{
    const unsigned char *ch = c->server ? c->hello_peer : c->hello_mine;
    const unsigned char *sh = c->server ? c->hello_mine : c->hello_peer;
    gux_proof(w->ctx->secret, w->ctx->secret_len, server_role, ch, sh, out);
}

static gser_status_t proof_check(gser_ucx_worker_t *w, gux_ctl_t *c, const unsigned char *got)
{
    unsigned char want[GUX_MAC_LEN];
    proof_of(w, c, !c->server, want);
    bool ok = gux_mac_equal(want, got);
    memset(want, 0, sizeof want);
    if (!ok)
        return gux_fail(GSER_ERR_ACCESS, "handshake: the %s's proof of the shared secret is wrong: refused",
                        c->server ? "client" : "server");
    return GSER_OK;
}

static gser_status_t proof_send(gser_ucx_worker_t *w, gux_ctl_t *c)
{
    unsigned char p[GUX_MAC_LEN];
    proof_of(w, c, c->server, p);
    gser_status_t st = ctl_send_rec(w, c, GUX_REC_PROOF, 0, p, sizeof p);
    memset(p, 0, sizeof p);
    return st;
}

static gser_status_t setup_send(gser_ucx_worker_t *w, gser_ucx_ep_t *ep)
{
    /* The header, the fixed part and this host's addresses (where its UCX
     * may connect from: the peer's admission filter lets them through),
     * then the worker address. */
    unsigned char h[GUX_REC_LEN + GUX_SETUP_FIXED + GUX_SETUP_IPS_MAX * GUX_IP_LEN] = {0};
    size_t k = gux_local_ips(h + GUX_REC_LEN + GUX_SETUP_FIXED, GUX_SETUP_IPS_MAX);
    size_t head = GUX_REC_LEN + GUX_SETUP_FIXED + k * GUX_IP_LEN;
    gux_rec_t r = {.type = GUX_REC_SETUP, .len = (uint32_t)(head - GUX_REC_LEN + w->ucp_addr_len)};
    gux_rec_encode(&r, h);
    for (int i = 0; i < 4; i++)
        h[GUX_REC_LEN + i] = (unsigned char)(ep->local_id >> (8 * i));
    h[GUX_REC_LEN + 4] = (unsigned char)k;
    return ctl_send(w, &ep->ctl, h, head, w->ucp_addr, w->ucp_addr_len);
}

/* The record types each step takes (as gux_rec_decode's mask). */
static unsigned step_allows(gux_ctl_step_t s, bool c_server)
{
    switch (s) {
    case GUX_CTL_PROOF: return 1u << GUX_REC_PROOF | 1u << GUX_REC_BYE;
    case GUX_CTL_SETUP: return 1u << GUX_REC_SETUP | 1u << GUX_REC_BYE;
    case GUX_CTL_OPEN: return 1u << GUX_REC_HEARTBEAT | 1u << GUX_REC_BYE | (c_server ? 0 : 1u << GUX_REC_READY);
    default: return 0;
    }
}

static uint64_t bye_value(const unsigned char *body)
{
    uint64_t v = 0;
    for (int i = GUX_BYE_LEN; i-- > 0;)
        v = v << 8 | body[i];
    return v;
}

gser_status_t gux_fifo_mismatch(const gser_ucx_ep_t *ep, const char *tl)
{
    return gux_fail(GSER_ERR_WIRE_VERSION,
                    "handshake: the peer %s's shared-memory FIFO holds %u segments, this side's %u%s%s%s: set "
                    "UCX_MM_FIFO_SIZE alike in every process of a host",
                    ep->ctl.peer_name, ep->peer.mm_fifo_size, ep->worker->mm_fifo, tl ? " (the endpoint's lanes use " : "",
                    tl ? tl : "", tl ? ")" : "");
}

/* A bye from the peer, as the status and message this side fails with. */
static gser_status_t bye_status(gux_ctl_t *c, const unsigned char *body)
{
    uint64_t v = bye_value(body);
    gser_ucx_ep_t *ep = ep_of(c);
    /* The peer refused this side's FIFO size before this side's own check
     * (endpoint.c, fifo_check): the same status and words on both sides. */
    if (c->rec.reason == GUX_BYE_ERROR && v == (uint64_t) - (int64_t)GSER_ERR_WIRE_VERSION &&
        ep->state == GUX_EP_CONNECTING && ep->peer_known && ep->peer.mm_fifo_size != ep->worker->mm_fifo)
        return gux_fifo_mismatch(ep, NULL);
    switch (c->rec.reason) {
    case GUX_BYE_SILENT:
        return gux_fail(GSER_ERR_CONNECTION,
                        "the peer %s heard nothing from this side for %llu ms and gave up on the connection "
                        "(this side stopped calling progress, or was stopped, or the network failed)",
                        c->peer_name, (unsigned long long)v);
    case GUX_BYE_ERROR:
        return gux_fail(GSER_ERR_CONNECTION, "the peer %s failed the connection (%s)", c->peer_name,
                        gser_status_str((gser_status_t) - (int64_t)v));
    case GUX_BYE_ACCESS:
        return gux_fail(GSER_ERR_ACCESS,
                        "handshake: the peer %s refused this side's proof of the shared secret (the secrets differ)",
                        c->peer_name);
    default:
        return gux_fail(GSER_ERR_CONNECTION, "the peer %s closed the connection", c->peer_name);
    }
}

/* ---- endpoints' control connections ---------------------------------------------------------- */

/* Let the address the peer's control connection uses through UCX's ports. */
static gser_status_t allow_peer(gser_ucx_ep_t *ep)
{
    unsigned char ip[GUX_IP_LEN];
    return gux_ip_of(&ep->ctl.peer_sa, ip) ? gux_filter_allow(ep, ip, 1) : GSER_OK;
}

static void ep_ctl_fail(gser_ucx_ep_t *ep, gser_status_t st)
{
    gux_ep_fail(ep, st); /* closes the control connection too, with a bye */
}

/* The peer's timeout, from its hello. */
static unsigned hello_timeout(const gux_ctl_t *c)
{
    const unsigned char *p = c->hello_peer + 24;
    return (unsigned)p[0] | (unsigned)p[1] << 8 | (unsigned)p[2] << 16 | (unsigned)p[3] << 24;
}

/* The handshake is over: heartbeats from now on, often enough for the
 * shorter timeout of the two sides. */
static void ctl_open(gser_ucx_worker_t *w, gux_ctl_t *c, unsigned peer_timeout_ms)
{
    unsigned mine = ctl_timeout(w), t = mine;
    /* A peer cannot make this side heartbeat more often than this. */
    if (peer_timeout_ms && peer_timeout_ms < GUX_MIN_PEER_TIMEOUT_MS)
        peer_timeout_ms = GUX_MIN_PEER_TIMEOUT_MS;
    if (peer_timeout_ms && (!t || peer_timeout_ms < t))
        t = peer_timeout_ms;
    c->step = GUX_CTL_OPEN;
    c->hb_ms = t ? (t / GUX_HEARTBEATS_PER_TIMEOUT ? t / GUX_HEARTBEATS_PER_TIMEOUT : 1) : 0;
    double now = gux_now_ms();
    c->last_rx = now;
    c->next_hb = now + c->hb_ms;
    if (c->hb_ms)
        timer_at(w, c->next_hb);
    if (mine)
        timer_at(w, now + mine);
}

static void sa_split(const struct sockaddr_storage *sa, char *host, size_t n, uint16_t *port)
{
    const void *a = NULL;
    if (sa->ss_family == AF_INET) {
        a = &((const struct sockaddr_in *)sa)->sin_addr;
        *port = ntohs(((const struct sockaddr_in *)sa)->sin_port);
    } else if (sa->ss_family == AF_INET6) {
        a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        *port = ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
    }
    if (!a || !inet_ntop(sa->ss_family, a, host, (socklen_t)n)) {
        host[0] = '\0';
        *port = 0;
    }
}

static void peer_info_set(gser_ucx_ep_t *ep, const gux_hello_t *h)
{
    /* Read now: the control connection may be gone when the caller asks. */
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (ep->ctl.io.fd >= 0 && getsockname(ep->ctl.io.fd, (struct sockaddr *)&sa, &len) == 0)
        sa_split(&sa, ep->peer.local_host, sizeof ep->peer.local_host, &ep->peer.local_port);
    len = sizeof sa;
    if (ep->ctl.io.fd >= 0 && getpeername(ep->ctl.io.fd, (struct sockaddr *)&sa, &len) == 0)
        sa_split(&sa, ep->peer.peer_host, sizeof ep->peer.peer_host, &ep->peer.peer_port);
    ep->peer.wire_version = h->wire_version;
    ep->peer.gser_wire_version = h->gser_wire_version;
    ep->peer.caps = h->caps;
    ep->peer.mm_fifo_size = h->mm_fifo;
    ep->peer_known = true;
}

/* A complete unit arrived on an endpoint's control connection. */
static gser_status_t ep_unit(gser_ucx_worker_t *w, gser_ucx_ep_t *ep)
{
    gux_ctl_t *c = &ep->ctl;
    gser_status_t st;
    if (c->step == GUX_CTL_HELLO) { /* the client, reading the server's hello */
        gux_hello_t h;
        memcpy(c->hello_peer, c->in, GUX_HELLO_LEN);
        if ((st = gux_hello_decode(c->in, &h)))
            return st;
        peer_info_set(ep, &h);
        if ((st = hello_check(w, &h, false)))
            return st;
        if (w->ctx->secret && (st = proof_send(w, c)))
            return st;
        c->step = w->ctx->secret ? GUX_CTL_PROOF : GUX_CTL_SETUP;
        return ctl_expect(c, GUX_REC_LEN, false);
    }
    if (!c->in_body) {
        gux_rec_t r;
        if ((st = gux_rec_decode(c->in, step_allows(c->step, c->server), &r)))
            return st;
        c->rec = r;
        if (r.len)
            return ctl_expect(c, r.len, true);
    }
    const unsigned char *body = c->body ? c->body : c->in;
    switch (c->rec.type) {
    case GUX_REC_BYE:
        if (c->rec.reason == GUX_BYE_CLOSING && c->step == GUX_CTL_OPEN) {
            /* What the peer sent before it closed is delivered first. */
            ep->peer_sent_known = true;
            ep->peer_sent = (uint32_t)bye_value(body);
        }
        return bye_status(c, body);
    case GUX_REC_HEARTBEAT:
        break;
    case GUX_REC_READY: /* the client: the server's side is connected too */
        ep->peer_ready = true;
        w->eps_dirty = true;
        break;
    case GUX_REC_PROOF: /* the client, checking the server's proof */
        if ((st = proof_check(w, c, body)))
            return st;
        c->step = GUX_CTL_SETUP;
        break;
    case GUX_REC_SETUP: {
        gux_setup_t su;
        if ((st = gux_setup_decode(body, c->rec.len, &su)))
            return st;
        /* The peer's UCX may connect from any of its addresses: let them
         * through before it learns ours (the client: before its setup). */
        if ((st = allow_peer(ep)) || (st = gux_filter_allow(ep, su.ips, su.nips)))
            return st;
        if ((st = gux_ep_ucx_connect(ep, su.addr)))
            return st;
        ep->peer_id = su.conn_id;
        if (!c->server && (st = setup_send(w, ep)))
            return st;
        ctl_open(w, c, hello_timeout(c)); /* ready once UCX has connected (gux_eps_process) */
        break;
    }
    }
    return ctl_expect(c, GUX_REC_LEN, false);
}

/* The client's TCP connect finished (or failed). */
static gser_status_t ep_connected(gser_ucx_worker_t *w, gser_ucx_ep_t *ep)
{
    gux_ctl_t *c = &ep->ctl;
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(c->io.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    if (err)
        return gux_fail(GSER_ERR_CONNECTION, "connect to %s: %s", c->peer_name, strerror(err));
    gser_status_t st;
    if ((st = gux_io_watch(w, &c->io, EPOLLIN)) || (st = ctl_send(w, c, c->hello_mine, GUX_HELLO_LEN, NULL, 0)))
        return st;
    c->step = GUX_CTL_HELLO;
    return ctl_expect(c, GUX_HELLO_LEN, false);
}

/* Read and write what an endpoint's control connection has. Returns how
 * many units were handled; the endpoint is failed on errors. */
static unsigned ep_io(gser_ucx_worker_t *w, gser_ucx_ep_t *ep, uint32_t events)
{
    gux_ctl_t *c = &ep->ctl;
    gser_status_t st = GSER_OK;
    unsigned n = 0;
    if (c->step == GUX_CTL_CONNECTING) {
        if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return 0;
        if ((st = ep_connected(w, ep)))
            goto fail;
        n++;
    }
    if (c->out_len && (st = ctl_flush(w, c)))
        goto fail;
    while (c->io.fd >= 0 && c->step != GUX_CTL_CONNECTING) {
        int r = ctl_fill(c, &st);
        if (r == 0)
            break;
        if (r < 0) {
            if (c->step < GUX_CTL_OPEN)
                gux_fail(st, "handshake: the peer %s closed the connection", c->peer_name);
            else
                gux_fail(st, "the peer %s closed the connection (its process may have ended)", c->peer_name);
            gux_ep_lost(ep, st);
            return n + 1;
        }
        n++;
        if ((st = ep_unit(w, ep))) {
            if (c->in_body && c->rec.type == GUX_REC_BYE) /* the peer said why it left */
                gux_ep_lost(ep, st);
            else
                ep_ctl_fail(ep, st);
            return n + 1;
        }
    }
    return n;
fail:
    ep_ctl_fail(ep, st);
    return n + 1;
}

gser_status_t gux_ctl_connect(gser_ucx_ep_t *ep, const struct sockaddr *sa, socklen_t len, const char *name)
{
    gser_ucx_worker_t *w = ep->worker;
    gux_ctl_t *c = &ep->ctl;
    c->server = false;
    snprintf(c->peer_name, sizeof c->peer_name, "%s", name);
    memcpy(&c->peer_sa, sa, len);
    gser_status_t st = hello_make(w, c);
    if (st)
        return st;
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return gux_fail(GSER_ERR_IO, "connect to %s: socket: %s", name, strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if ((st = io_open(w, &c->io, fd, GUX_IO_EP, EPOLLOUT))) {
        close(fd);
        return st;
    }
    c->step = GUX_CTL_CONNECTING;
    c->deadline = gux_now_ms() + w->ctx->handshake_ms;
    timer_at(w, c->deadline);
    int rc;
    do
        rc = connect(fd, sa, len);
    while (rc != 0 && errno == EINTR);
    if (rc != 0 && errno != EINPROGRESS) {
        /* Reported through the endpoint, as a refusal that takes a round
         * trip would be. */
        gux_fail(GSER_ERR_CONNECTION, "connect to %s: %s", name, strerror(errno));
        ep_ctl_fail(ep, GSER_ERR_CONNECTION);
    }
    w->ctl_now = true;
    return GSER_OK;
}

void gux_ctl_read_now(gser_ucx_ep_t *ep)
{
    if (ep->ctl.io.fd >= 0 && ep->ctl.step != GUX_CTL_CONNECTING)
        ep_io(ep->worker, ep, EPOLLIN);
}

gser_status_t gux_ctl_ready(gser_ucx_ep_t *ep)
{
    return ctl_send_rec(ep->worker, &ep->ctl, GUX_REC_READY, 0, NULL, 0);
}

void gux_ctl_close(gser_ucx_ep_t *ep, unsigned reason, uint64_t value)
{
    gux_ctl_t *c = &ep->ctl;
    gser_ucx_worker_t *w = ep->worker;
    if (c->io.fd >= 0) {
        /* Last words, if the connection got that far: the peer learns why
         * instead of only that it is gone. What the socket does not take
         * now is dropped. */
        if (reason && c->step >= GUX_CTL_SETUP) {
            char keep[512];
            snprintf(keep, sizeof keep, "%s", gser_ucx_get_last_error());
            ctl_send_bye(w, c, reason, value);
            gux_fail(GSER_OK, "%s", keep);
        }
        gux_io_close(w, &c->io);
    }
    free(c->body);
    free(c->out);
    c->body = c->out = NULL;
    c->out_len = c->out_off = 0;
    c->step = GUX_CTL_NONE;
}

/* ---- listeners --------------------------------------------------------------------------------- */

static void pconn_free(gser_ucx_worker_t *w, gux_pconn_t *pc)
{
    gux_list_del(&pc->link);
    pc->listener->npending--;
    gux_io_close(w, &pc->ctl.io);
    free(pc->ctl.body);
    free(pc->ctl.out);
    free(pc);
}

/* End a handshake before admission. counter: the stats field it counts in;
 * st: reported to the application when the peer had sent a hello (else 0). */
static void pconn_drop(gser_ucx_worker_t *w, gux_pconn_t *pc, uint64_t *counter, gser_status_t st)
{
    gser_ucx_listener_t *l = pc->listener;
    (*counter)++;
    pconn_free(w, pc);
    if (st)
        gux_listener_failure(l, st, gser_ucx_get_last_error());
}

/* The client proved what it had to: it gets an endpoint, and this side's
 * proof (with a secret) and setup record. */
static gser_status_t pconn_admit(gser_ucx_worker_t *w, gux_pconn_t *pc)
{
    gser_ucx_listener_t *l = pc->listener;
    gser_ucx_ep_t *ep;
    gux_hello_t h;
    gux_hello_decode(pc->ctl.hello_peer, &h); /* checked when it came */
    gser_status_t st = gux_ep_new(w, &ep);
    if (st) {
        pconn_drop(w, pc, &l->stats.failed, st);
        return st;
    }
    /* The connection moves into the endpoint; its id stays. */
    ep->ctl = pc->ctl;
    ep->ctl.io.kind = GUX_IO_EP;
    gux_slot_set(&w->io, ep->ctl.io.id, &ep->ctl.io);
    pc->ctl.io.fd = -1;
    pc->ctl.body = pc->ctl.out = NULL;
    pconn_free(w, pc);
    ep->listener = l;
    ep->admitting = true;
    l->nadmitting++;
    peer_info_set(ep, &h);
    gux_ctl_t *c = &ep->ctl;
    /* The client's UCX connects as soon as it has this side's setup. */
    if ((st = allow_peer(ep)) || (w->ctx->secret && (st = proof_send(w, c))) || (st = setup_send(w, ep)) ||
        (st = ctl_expect(c, GUX_REC_LEN, false))) {
        ep_ctl_fail(ep, st);
        return GSER_OK; /* reported through the endpoint */
    }
    c->step = GUX_CTL_SETUP;
    return GSER_OK;
}

/* A complete unit arrived on a connection before admission. */
static gser_status_t pconn_unit(gser_ucx_worker_t *w, gux_pconn_t *pc, bool *admitted)
{
    gux_ctl_t *c = &pc->ctl;
    gser_ucx_listener_t *l = pc->listener;
    gser_status_t st;
    if (c->step == GUX_CTL_HELLO) {
        gux_hello_t h;
        memcpy(c->hello_peer, c->in, GUX_HELLO_LEN);
        if ((st = gux_hello_decode(c->in, &h))) {
            if (st == GSER_ERR_BAD_MAGIC) {
                pconn_drop(w, pc, &l->stats.refused, GSER_OK); /* not a gser peer: no report */
                return GSER_ERR_BAD_MAGIC;
            }
            pconn_drop(w, pc, &l->stats.failed, st);
            return st;
        }
        if ((st = hello_make(w, c)) == GSER_OK)
            st = hello_check(w, &h, true);
        /* The client learns from this side's hello what differs, if anything. */
        if (st != GSER_ERR_IO && st != GSER_ERR_NO_MEMORY) {
            gser_status_t sst = ctl_send(w, c, c->hello_mine, GUX_HELLO_LEN, NULL, 0);
            if (!st)
                st = sst;
        }
        if (st) {
            pconn_drop(w, pc, &l->stats.failed, st);
            return st;
        }
        if (w->ctx->secret) {
            c->step = GUX_CTL_PROOF;
            return ctl_expect(c, GUX_REC_LEN, false);
        }
        *admitted = true;
        return pconn_admit(w, pc);
    }
    /* GUX_CTL_PROOF: a proof record, nothing else. */
    if (!c->in_body) {
        gux_rec_t r;
        if ((st = gux_rec_decode(c->in, 1u << GUX_REC_PROOF, &r))) {
            gux_fail(GSER_ERR_ACCESS, "handshake: the client sent no proof of the shared secret: refused");
            pconn_drop(w, pc, &l->stats.failed, GSER_ERR_ACCESS);
            return GSER_ERR_ACCESS;
        }
        c->rec = r;
        return ctl_expect(c, r.len, true);
    }
    if ((st = proof_check(w, c, c->in))) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", gser_ucx_get_last_error());
        ctl_send_bye(w, c, GUX_BYE_ACCESS, 0);
        gux_fail(st, "%s", msg);
        pconn_drop(w, pc, &l->stats.failed, st);
        return st;
    }
    *admitted = true;
    return pconn_admit(w, pc);
}

static unsigned pconn_io(gser_ucx_worker_t *w, gux_pconn_t *pc)
{
    unsigned n = 0;
    for (;;) {
        gser_status_t st;
        int r = ctl_fill(&pc->ctl, &st);
        if (r == 0)
            return n;
        n++;
        if (r < 0) {
            /* Gone before its hello: not a gser peer, or one that gave up. */
            bool hello = pc->ctl.step != GUX_CTL_HELLO;
            gser_ucx_listener_t *l = pc->listener;
            if (hello)
                gux_fail(GSER_ERR_CONNECTION, "handshake: the client %s closed the connection", pc->ctl.peer_name);
            pconn_drop(w, pc, hello ? &l->stats.failed : &l->stats.refused, hello ? GSER_ERR_CONNECTION : GSER_OK);
            return n;
        }
        bool admitted = false;
        if (pconn_unit(w, pc, &admitted) || admitted)
            return n; /* pc is gone */
    }
}

/* A connection the listener took: its handshake starts (the hello may be
 * there already). Takes fd. */
/* Make room for one more handshake: the oldest before admission gives way,
 * else the oldest admitted one (reported as failed). */
static void make_room(gser_ucx_worker_t *w, gser_ucx_listener_t *l)
{
    if (l->npending + l->nadmitting < GUX_MAX_PENDING)
        return;
    if (l->npending) {
        pconn_drop(w, gux_container(l->pending.next, gux_pconn_t, link), &l->stats.evicted, GSER_OK);
        return;
    }
    for (gux_list_t *n = w->eps.next; n != &w->eps; n = n->next) {
        gser_ucx_ep_t *ep = gux_container(n, gser_ucx_ep_t, wlink);
        if (ep->listener == l && ep->admitting) {
            gux_fail(GSER_ERR_TIMEOUT, "handshake with %s: dropped unfinished to make room for newer connections",
                     ep->ctl.peer_name);
            ep_ctl_fail(ep, GSER_ERR_TIMEOUT);
            return;
        }
    }
}

static void pconn_start(gser_ucx_worker_t *w, gser_ucx_listener_t *l, int fd, const struct sockaddr_storage *sa)
{
    make_room(w, l);
    gux_pconn_t *pc = calloc(1, sizeof *pc);
    if (!pc) {
        close(fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pc->listener = l;
    pc->ctl.server = true;
    pc->ctl.step = GUX_CTL_HELLO;
    memcpy(&pc->ctl.peer_sa, sa, sizeof *sa);
    sa_name(sa, pc->ctl.peer_name, sizeof pc->ctl.peer_name);
    if (io_open(w, &pc->ctl.io, fd, GUX_IO_PCONN, EPOLLIN)) {
        close(fd);
        free(pc);
        return;
    }
    gux_list_push(&l->pending, &pc->link);
    l->npending++;
    pc->ctl.deadline = gux_now_ms() + w->ctx->handshake_ms;
    timer_at(w, pc->ctl.deadline);
    if (ctl_expect(&pc->ctl, GUX_HELLO_LEN, false) == GSER_OK)
        pconn_io(w, pc);
}

gser_status_t gser_ucx_listener_adopt(gser_ucx_listener_t *l, int fd)
{
    if (!l || fd < 0)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_listener_adopt: bad argument");
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return gux_fail(GSER_ERR_IO, "gser_ucx_listener_adopt: fcntl: %s", strerror(errno));
    struct sockaddr_storage sa = {.ss_family = AF_UNSPEC};
    socklen_t len = sizeof sa;
    getpeername(fd, (struct sockaddr *)&sa, &len);
    gux_lock(l->worker);
    pconn_start(l->worker, l, fd, &sa);
    gux_unlock(l->worker);
    return GSER_OK;
}

static void listener_accept(gser_ucx_worker_t *w, gser_ucx_listener_t *l)
{
    for (int i = 0; i < GUX_ACCEPT_BATCH; i++) {
        struct sockaddr_storage sa;
        socklen_t salen = sizeof sa;
        int fd = accept4(l->io.fd, (struct sockaddr *)&sa, &salen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if ((errno == EMFILE || errno == ENFILE) && l->npending) {
                /* Out of descriptors: the oldest handshake makes room. */
                pconn_drop(w, gux_container(l->pending.next, gux_pconn_t, link), &l->stats.evicted, GSER_OK);
                continue;
            }
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
                /* Nothing to give back: rest a moment rather than spin. */
                gux_io_watch(w, &l->io, 0);
                l->resume_at = gux_now_ms() + GUX_EMFILE_PAUSE_MS;
                timer_at(w, l->resume_at);
            }
            return;
        }
        pconn_start(w, l, fd, &sa);
    }
    w->ctl_now = true; /* more may be queued */
}

gser_status_t gux_ctl_listen(gser_ucx_listener_t *l, const struct sockaddr *sa, socklen_t len)
{
    gser_ucx_worker_t *w = l->worker;
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return gux_fail(GSER_ERR_IO, "listen: socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    gser_status_t st;
    if (bind(fd, sa, len) != 0 || listen(fd, SOMAXCONN) != 0 || getsockname(fd, (struct sockaddr *)&bound, &blen) != 0) {
        char name[96];
        memcpy(&bound, sa, len);
        sa_name(&bound, name, sizeof name);
        st = gux_fail(errno == EADDRINUSE ? GSER_ERR_EXISTS : errno == EADDRNOTAVAIL ? GSER_ERR_INVALID_ARG
                                                                                         : GSER_ERR_IO,
                      "listen on %s: %s", name, strerror(errno));
        close(fd);
        return st;
    }
    if ((st = io_open(w, &l->io, fd, GUX_IO_LISTENER, EPOLLIN))) {
        close(fd);
        return st;
    }
    l->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    return GSER_OK;
}

void gux_ctl_unlisten(gser_ucx_listener_t *l)
{
    gser_ucx_worker_t *w = l->worker;
    while (!gux_list_empty(&l->pending))
        pconn_free(w, gux_container(l->pending.next, gux_pconn_t, link));
    gux_io_close(w, &l->io);
}

/* ---- timers ---------------------------------------------------------------------------------- */

/* Handshake deadlines, heartbeats and silence; then when to look again. */
static unsigned ctl_timers(gser_ucx_worker_t *w, double now)
{
    unsigned n = 0;
    double next = INFINITY;
    for (gux_list_t *ln = w->listeners.next; ln != &w->listeners; ln = ln->next) {
        gser_ucx_listener_t *l = gux_container(ln, gser_ucx_listener_t, wlink);
        if (l->resume_at) { /* resting after EMFILE */
            if (now >= l->resume_at) {
                gux_io_watch(w, &l->io, EPOLLIN);
                l->resume_at = 0;
            } else if (l->resume_at < next) {
                next = l->resume_at;
            }
        }
        gux_list_t *pn = l->pending.next;
        while (pn != &l->pending) {
            gux_pconn_t *pc = gux_container(pn, gux_pconn_t, link);
            pn = pn->next;
            if (now < pc->ctl.deadline) {
                if (pc->ctl.deadline < next)
                    next = pc->ctl.deadline;
                continue;
            }
            bool hello = pc->ctl.step != GUX_CTL_HELLO;
            if (hello)
                gux_fail(GSER_ERR_TIMEOUT, "handshake: the client %s did not finish its handshake within %u ms",
                         pc->ctl.peer_name, w->ctx->handshake_ms);
            pconn_drop(w, pc, &l->stats.timed_out, hello ? GSER_ERR_TIMEOUT : GSER_OK);
            n++;
        }
    }
    unsigned timeout = ctl_timeout(w);
    for (gux_list_t *en = w->eps.next; en != &w->eps;) {
        gser_ucx_ep_t *ep = gux_container(en, gser_ucx_ep_t, wlink);
        en = en->next;
        gux_ctl_t *c = &ep->ctl;
        if (ep->drain_until) { /* waiting for what a peer that closed sent */
            if (now >= ep->drain_until) {
                w->eps_dirty = true;
                n++;
            } else if (ep->drain_until < next) {
                next = ep->drain_until;
            }
        }
        if (c->io.fd < 0)
            continue;
        if (c->step != GUX_CTL_OPEN || ep->state == GUX_EP_CONNECTING) {
            if (now >= c->deadline) {
                gux_fail(GSER_ERR_TIMEOUT, "handshake with %s: not finished within %u ms", c->peer_name,
                         w->ctx->handshake_ms);
                ep_ctl_fail(ep, GSER_ERR_TIMEOUT);
                n++;
            } else if (c->deadline < next) {
                next = c->deadline;
            }
            continue;
        }
        double silent = now - c->last_rx;
        if (timeout && silent >= timeout) {
            gux_fail(GSER_ERR_CONNECTION,
                     "the peer %s went silent: nothing heard from it for %.0f ms (peer_timeout_ms %u); "
                     "it is stopped or hung, or the network between us failed",
                     c->peer_name, silent, timeout);
            gux_ep_fail_bye(ep, GSER_ERR_CONNECTION, GUX_BYE_SILENT, (uint64_t)silent);
            n++;
            continue;
        }
        if (timeout && c->last_rx + timeout < next)
            next = c->last_rx + timeout;
        if (c->hb_ms && now >= c->next_hb) {
            /* A full socket means the peer reads nothing: skipping a
             * heartbeat costs nothing then. */
            if (c->out_len == c->out_off && ctl_send_rec(w, c, GUX_REC_HEARTBEAT, 0, NULL, 0)) {
                gux_ep_fail(ep, GSER_ERR_CONNECTION);
                n++;
                continue;
            }
            c->next_hb = now + c->hb_ms;
        }
        if (c->hb_ms && c->next_hb < next)
            next = c->next_hb;
    }
    double pn = gux_probe_timer(w, now);
    if (pn < next)
        next = pn;
    w->timer_next = next;
    return n;
}

void gux_ctl_arm_timer(gser_ucx_worker_t *w)
{
    struct itimerspec its = {0};
    if (isfinite(w->timer_next)) {
        double ms = w->timer_next - gux_now_ms();
        long long us = ms < 0.05 ? 50 : (long long)(ms * 1000); /* 0 would disarm it */
        its.it_value.tv_sec = (time_t)(us / 1000000);
        its.it_value.tv_nsec = (long)(us % 1000000) * 1000;
    }
    timerfd_settime(w->tfd, 0, &its, NULL);
}

/* ---- one round ---------------------------------------------------------------------------------- */

unsigned gux_ctl_progress(gser_ucx_worker_t *w)
{
    w->ctl_now = false;
    w->ctl_rounds = 0;
    unsigned n = 0;
    struct epoll_event evs[64];
    int k = epoll_wait(w->efd, evs, 64, 0);
    for (int i = 0; i < k; i++) {
        uint64_t tag = evs[i].data.u64;
        if (tag == GUX_TAG_UCX)
            continue; /* UCX's own progress follows */
        if (tag == GUX_TAG_TIMER) {
            uint64_t ticks;
            if (read(w->tfd, &ticks, sizeof ticks) < 0) {
                /* nothing to clear */
            }
            continue;
        }
        /* The object may have gone while this batch was handled: look it
         * up by id, which a new owner of the slot does not share. */
        gux_io_t *io = gux_slot_get(&w->io, (uint32_t)tag);
        if (!io)
            continue;
        switch (io->kind) {
        case GUX_IO_LISTENER:
            listener_accept(w, gux_container(io, gser_ucx_listener_t, io));
            n++;
            break;
        case GUX_IO_PCONN:
            n += pconn_io(w, pconn_of(ctl_of(io)));
            break;
        case GUX_IO_EP:
            n += ep_io(w, ep_of(ctl_of(io)), evs[i].events);
            break;
        }
    }
    if (k == 64)
        w->ctl_now = true;
    double now = gux_now_ms();
    w->ctl_last = now;
    if (now >= w->timer_next)
        n += ctl_timers(w, now);
    return n;
}
