/* A program built against an installed gser::ucx: a context, a worker and
 * a listener on a free port of 127.0.0.1. */
#include <stdio.h>

#include <gser/ucx.h>

int main(void)
{
    gser_ucx_context_t *ctx;
    gser_ucx_worker_t *w;
    gser_ucx_listener_t *l;
    gser_ucx_listener_options_t lo = {.size = sizeof(gser_ucx_listener_options_t), .address = "127.0.0.1"};
    if (gser_ucx_context_create(NULL, &ctx) || gser_ucx_worker_create(ctx, NULL, &w) ||
        gser_ucx_listener_create(w, &lo, &l)) {
        fprintf(stderr, "%s\n", gser_ucx_get_last_error());
        return 1;
    }
    printf("gser ucx: listening on a port: %s\n", gser_ucx_listener_get_port(l) ? "yes" : "no");
    gser_ucx_listener_destroy(l);
    gser_ucx_worker_destroy(w);
    gser_ucx_context_destroy(ctx);
    return 0;
}
