#include "plan.h"

size_t gser_plan_count(const gser_copy_t *copies, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += (copies[i].size + GSER_CHUNK_BYTES - 1) / GSER_CHUNK_BYTES;
    return total;
}

void gser_plan_fill(const gser_copy_t *copies, size_t n, gser_chunk_t *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *src = copies[i].src;
        unsigned char *dst = copies[i].dst;
        for (size_t off = 0; off < copies[i].size; off += GSER_CHUNK_BYTES) {
            size_t left = copies[i].size - off;
            out[k].src = src + off;
            out[k].dst = dst + off;
            out[k].len = left < GSER_CHUNK_BYTES ? left : GSER_CHUNK_BYTES;
            k++;
        }
    }
}
