#include "plan.h"

static size_t chunks_of(const devl_copy_t *c)
{
    size_t n = (c->size + DEVL_CHUNK_BYTES - 1) / DEVL_CHUNK_BYTES;
    return n ? n : (c->zpad ? 1 : 0);
}

size_t devl_plan_count(const devl_copy_t *copies, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += chunks_of(&copies[i]);
    return total;
}

void devl_plan_fill(const devl_copy_t *copies, size_t n, devl_chunk_t *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *src = copies[i].src;
        unsigned char *dst = copies[i].dst;
        size_t m = chunks_of(&copies[i]);
        for (size_t j = 0; j < m; j++) {
            size_t off = j * DEVL_CHUNK_BYTES, left = copies[i].size - off;
            out[k].src = src + off;
            out[k].dst = dst + off;
            out[k].len = (uint32_t)(left < DEVL_CHUNK_BYTES ? left : DEVL_CHUNK_BYTES);
            out[k].zpad = j + 1 == m ? (uint32_t)copies[i].zpad : 0; /* the padding follows the last chunk */
            k++;
        }
    }
}
