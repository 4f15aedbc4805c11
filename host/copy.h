/* Short copies, shared by the core and by the Python module's direct path
 * (plugins/python/src/direct.c), which includes this folder's sink. */
#ifndef GSER_HOST_COPY_H
#define GSER_HOST_COPY_H

#include <stdint.h>
#include <string.h>

/* Copy len bytes: most strings and small bodies of a message are short, so
 * up to 16 bytes take two overlapping moves (or three byte moves), no call. */
static inline void gser__copy_short(void *dst, const void *src, size_t len)
{
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    if (len >= 8 && len <= 16) {
        uint64_t a, b;
        memcpy(&a, s, 8);
        memcpy(&b, s + len - 8, 8);
        memcpy(d, &a, 8);
        memcpy(d + len - 8, &b, 8);
    } else if (len >= 4 && len < 8) {
        uint32_t a, b;
        memcpy(&a, s, 4);
        memcpy(&b, s + len - 4, 4);
        memcpy(d, &a, 4);
        memcpy(d + len - 4, &b, 4);
    } else if (len && len < 4) {
        unsigned char a = s[0], m = s[len / 2], z = s[len - 1];
        d[0] = a;
        d[len / 2] = m;
        d[len - 1] = z;
    } else if (len) {
        memcpy(d, s, len);
    }
}

#endif
