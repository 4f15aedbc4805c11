/* The frames vector of a serialized message: growth and the accessors that
 * only read it. Calls no other file of the core: encode.c and pack.c both
 * add frames through it. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

gser_status_t gser__frames_push(gser_frames_t *f, const gser_frame_t *fr)
{
    if (f->n == f->cap) {
        size_t cap = f->cap * 2;
        gser_frame_t *nf = f->frames == f->inline_frames ? malloc(cap * sizeof *nf)
                                                         : realloc(f->frames, cap * sizeof *nf);
        if (!nf)
            return GSER_ERR_NO_MEMORY;
        if (f->frames == f->inline_frames)
            memcpy(nf, f->inline_frames, sizeof f->inline_frames);
        f->frames = nf;
        f->cap = cap;
    }
    f->frames[f->n++] = *fr;
    return GSER_OK;
}

size_t gser_frames_get_count(const gser_frames_t *frames)
{
    return frames ? frames->n : 0;
}

const gser_frame_t *gser_frames_get_array(const gser_frames_t *frames)
{
    return frames ? frames->frames : NULL;
}

void *gser_frames_get_event(const gser_frames_t *frames)
{
    return frames ? frames->event : NULL;
}
