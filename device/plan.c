#include "plan.h"

static size_t chunks_of(const gser_copy_t *c)
{
    size_t n = (c->size + GSER_CHUNK_BYTES - 1) / GSER_CHUNK_BYTES;
    return n ? n : (c->zpad ? 1 : 0);
}

size_t gser_plan_count(const gser_copy_t *copies, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += chunks_of(&copies[i]);
    return total;
}

void gser_plan_fill(const gser_copy_t *copies, size_t n, gser_chunk_t *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *src = copies[i].src;
        unsigned char *dst = copies[i].dst;
        size_t m = chunks_of(&copies[i]);
        for (size_t j = 0; j < m; j++) {
            size_t off = j * GSER_CHUNK_BYTES, left = copies[i].size - off;
            out[k].src = src + off;
            out[k].dst = dst + off;
            out[k].len = (uint32_t)(left < GSER_CHUNK_BYTES ? left : GSER_CHUNK_BYTES);
            out[k].zpad = j + 1 == m ? (uint32_t)copies[i].zpad : 0; /* the padding follows the last chunk */
            k++;
        }
    }
}
