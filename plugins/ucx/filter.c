/* The admission filter on UCX's own ports (docs/ucx.md section 2.3).
 *
 * UCX's tcp transport listens on a port per network device, for the
 * endpoints made from worker addresses. It checks an 8-byte magic and then
 * trusts whatever connects: 13 crafted bytes abort the process (an
 * assertion in its connection packet handling). gser cannot check that
 * protocol, so it keeps strangers from reaching it: each of those listening
 * sockets gets a socket filter (classic BPF, SO_ATTACH_FILTER) that drops
 * the connection attempts of every host gser has not admitted. A peer's
 * addresses (the one its control connection came from, and those its setup
 * record lists) are allowed once its hello, and with a secret its proof,
 * passed; they are dropped again when its last endpoint goes. A dropped
 * SYN gets no answer, as from a firewall. The kernel copies a listening
 * socket's filter into the connections it accepts, so a connection that
 * got in stays in.
 *
 * The listening sockets are told apart from the application's by comparing
 * the process's listening TCP sockets before and after ucp_worker_create
 * (gser's own worker creations in other threads wait on a lock), and by
 * finding each one's port in the new worker's address. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <linux/filter.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"

/* More admitted addresses than this and the filter opens (the program
 * would exceed what the kernel takes): documented. */
#define GUX_ALLOW_MAX 400

static pthread_mutex_t g_snapshot = PTHREAD_MUTEX_INITIALIZER;

typedef struct lsock {
    int fd;
    ino_t ino;
} lsock_t;

/* This process's listening TCP sockets, up to cap. */
static size_t listening(lsock_t *out, size_t cap)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 0;
    size_t n = 0;
    int dfd = dirfd(d);
    for (struct dirent *e; (e = readdir(d)) && n < cap;) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (*end || fd < 0 || fd == dfd)
            continue;
        int v = 0, proto = 0;
        socklen_t len = sizeof v;
        struct stat st;
        if (getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) != 0 || !v)
            continue;
        len = sizeof proto;
        if (getsockopt((int)fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len) != 0 || proto != IPPROTO_TCP ||
            fstat((int)fd, &st) != 0)
            continue;
        out[n++] = (lsock_t){(int)fd, st.st_ino};
    }
    closedir(d);
    return n;
}

#define GUX_LSOCK_MAX 1024

void *gux_filter_before(void)
{
    lsock_t *snap = calloc(GUX_LSOCK_MAX + 1, sizeof *snap);
    pthread_mutex_lock(&g_snapshot);
    if (snap)
        snap[0].fd = (int)listening(snap + 1, GUX_LSOCK_MAX);
    return snap;
}

/* Whether the port of fd's bound address appears in the worker address. */
static bool port_in_address(int fd, const void *addr, size_t len)
{
    struct sockaddr_storage sa;
    socklen_t salen = sizeof sa;
    if (getsockname(fd, (struct sockaddr *)&sa, &salen) != 0)
        return false;
    uint16_t port = sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                             : ((struct sockaddr_in *)&sa)->sin_port;
    const unsigned char *p = addr, *pb = (const unsigned char *)&port;
    for (size_t i = 0; i + 1 < len; i++)
        if ((p[i] == pb[0] && p[i + 1] == pb[1]) || (p[i] == pb[1] && p[i + 1] == pb[0]))
            return true;
    return false;
}

void gux_filter_after(gser_ucx_worker_t *w, void *snapshot)
{
    lsock_t *before = snapshot, now[64];
    size_t n = w->ucp ? listening(now, 64) : 0;
    pthread_mutex_unlock(&g_snapshot);
    const char *env = getenv("GSER_UCX_FILTER");
    w->filter_off = env && strcmp(env, "0") == 0;
    for (size_t i = 0; i < n && before && !w->filter_off; i++) {
        bool old = false;
        for (int k = 1; k <= before[0].fd && !old; k++)
            old = before[k].fd == now[i].fd && before[k].ino == now[i].ino;
        if (old || !port_in_address(now[i].fd, w->ucp_addr, w->ucp_addr_len) ||
            w->nucx_lfds == sizeof w->ucx_lfds / sizeof w->ucx_lfds[0])
            continue;
        w->ucx_lfds[w->nucx_lfds++] = now[i].fd;
    }
    free(before);
    gux_filter_apply(w);
}

/* ---- the program ------------------------------------------------------------------------------ */

#define LD_NET(off) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)(SKF_NET_OFF + (off)))
#define ACCEPT BPF_STMT(BPF_RET | BPF_K, 0xffffffffu)
#define DROP BPF_STMT(BPF_RET | BPF_K, 0)

static bool is_v4(const unsigned char ip[GUX_IP_LEN])
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(ip, mapped, sizeof mapped) == 0;
}

static uint32_t word(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* IPv4 packets: the source address against each IPv4 entry; IPv6 packets:
 * against each IPv6 entry, word by word. Every jump is short (a cBPF
 * conditional jump reaches 255 instructions), the long one an ja. */
static size_t program(const gser_ucx_worker_t *w, struct sock_filter *f)
{
    size_t n = 0;
    f[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_B | BPF_ABS, (uint32_t)SKF_NET_OFF);
    f[n++] = (struct sock_filter)BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xf0);
    f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x40, 1, 0);
    size_t to_v6 = n++;
    f[n++] = (struct sock_filter)LD_NET(12);
    for (size_t i = 0; i < w->nallow; i++) {
        if (!is_v4(w->allow[i].ip))
            continue;
        f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, word(w->allow[i].ip + 12), 0, 1);
        f[n++] = (struct sock_filter)ACCEPT;
    }
    f[n++] = (struct sock_filter)DROP;
    f[to_v6] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JA, (uint32_t)(n - to_v6 - 1), 0, 0);
    for (size_t i = 0; i < w->nallow; i++) {
        if (is_v4(w->allow[i].ip))
            continue;
        for (int k = 0; k < 4; k++) {
            f[n++] = (struct sock_filter)LD_NET(8 + 4 * k);
            f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, word(w->allow[i].ip + 4 * k), 0,
                                                  (uint8_t)(7 - 2 * k));
        }
        f[n++] = (struct sock_filter)ACCEPT;
    }
    f[n++] = (struct sock_filter)DROP;
    return n;
}

void gux_filter_apply(gser_ucx_worker_t *w)
{
    if (!w->nucx_lfds || w->filter_off)
        return;
    static struct sock_filter open_all[] = {ACCEPT};
    struct sock_filter *f = NULL;
    struct sock_fprog prog = {.len = 1, .filter = open_all};
    /* 5 to branch and load, 2 per IPv4 entry, 9 per IPv6 one, 2 drops. */
    if (w->nallow <= GUX_ALLOW_MAX && (f = malloc((7 + 9 * w->nallow) * sizeof *f)))
        prog = (struct sock_fprog){.len = (unsigned short)program(w, f), .filter = f};
    for (size_t i = 0; i < w->nucx_lfds; i++)
        setsockopt(w->ucx_lfds[i], SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog);
    free(f);
}

/* ---- admitted addresses ------------------------------------------------------------------------- */

bool gux_ip_of(const struct sockaddr_storage *sa, unsigned char out[GUX_IP_LEN])
{
    memset(out, 0, GUX_IP_LEN);
    if (sa->ss_family == AF_INET6) {
        memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, GUX_IP_LEN);
        return true;
    }
    if (sa->ss_family != AF_INET)
        return false;
    out[10] = out[11] = 0xff;
    memcpy(out + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    return true;
}

gser_status_t gux_filter_allow(gser_ucx_ep_t *ep, const unsigned char *ips, size_t n)
{
    gser_ucx_worker_t *w = ep->worker;
    bool changed = false;
    for (size_t k = 0; k < n; k++) {
        const unsigned char *ip = ips + k * GUX_IP_LEN;
        bool dup = false;
        for (size_t j = 0; j < ep->nallowed && !dup; j++)
            dup = memcmp(ep->allowed + j * GUX_IP_LEN, ip, GUX_IP_LEN) == 0;
        if (dup || ep->nallowed == GUX_SETUP_IPS_MAX + 1)
            continue;
        size_t i = 0;
        while (i < w->nallow && memcmp(w->allow[i].ip, ip, GUX_IP_LEN) != 0)
            i++;
        if (i == w->nallow) {
            if (w->nallow == w->allow_cap) {
                size_t cap = w->allow_cap ? 2 * w->allow_cap : 16;
                gux_allow_t *a = realloc(w->allow, cap * sizeof *a);
                if (!a)
                    return gux_fail(GSER_ERR_NO_MEMORY, "handshake: out of memory");
                w->allow = a;
                w->allow_cap = cap;
            }
            memcpy(w->allow[i].ip, ip, GUX_IP_LEN);
            w->allow[i].refs = 0;
            w->nallow++;
            changed = true;
        }
        w->allow[i].refs++;
        memcpy(ep->allowed + ep->nallowed++ * GUX_IP_LEN, ip, GUX_IP_LEN);
    }
    if (changed)
        gux_filter_apply(w);
    return GSER_OK;
}

void gux_filter_release(gser_ucx_ep_t *ep)
{
    gser_ucx_worker_t *w = ep->worker;
    bool changed = false;
    for (size_t k = 0; k < ep->nallowed; k++) {
        for (size_t i = 0; i < w->nallow; i++) {
            if (memcmp(w->allow[i].ip, ep->allowed + k * GUX_IP_LEN, GUX_IP_LEN) != 0)
                continue;
            if (--w->allow[i].refs == 0) {
                w->allow[i] = w->allow[--w->nallow];
                changed = true;
            }
            break;
        }
    }
    ep->nallowed = 0;
    if (changed)
        gux_filter_apply(w);
}

size_t gux_local_ips(unsigned char *out, size_t cap)
{
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0)
        return 0;
    size_t n = 0;
    for (struct ifaddrs *i = ifs; i && n < cap; i = i->ifa_next) {
        if (!i->ifa_addr || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
            continue;
        if (i->ifa_addr->sa_family == AF_INET6 &&
            IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr))
            continue;
        if (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)
            continue;
        struct sockaddr_storage sa;
        memcpy(&sa, i->ifa_addr, i->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                                   : sizeof(struct sockaddr_in6));
        gux_ip_of(&sa, out + n++ * GUX_IP_LEN);
    }
    freeifaddrs(ifs);
    return n;
}
