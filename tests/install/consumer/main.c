#include <stdio.h>

#include <gser/gser.h>

int main(void)
{
    gser_context_t *ctx;
    gser_msg_t *msg;
    gser_frames_t *frames;
    if (gser_context_create(NULL, &ctx) || gser_msg_create(ctx, &msg) || gser_serialize(ctx, msg, NULL, &frames))
        return 1;
    printf("gser %s: %zu frame(s)\n", gser_version_str(), gser_frames_get_count(frames));
    gser_frames_destroy(frames);
    gser_msg_destroy(msg);
    gser_context_destroy(ctx);
    return 0;
}
