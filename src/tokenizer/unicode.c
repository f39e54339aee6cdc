/* Code point classes (lookup in the generated tables), strict UTF-8
 * validation and decoding, and the GPT-2 byte alphabet. Not here: what the
 * classes are used for (pretok.c). */
#include "tokenizer-impl.h"

#include "base/base.h"

#include <string.h>

uint16_t nm_unicode_flags(uint32_t cp) {
    if (cp < 128) return nm_unicode_ascii_flags[cp];
    NM_ASSERT(cp <= 0x10FFFF);
    /* the last range whose start is <= cp */
    uint32_t lo = 0, hi = nm_unicode_n_ranges;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (nm_unicode_range_start[mid] <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return nm_unicode_range_flags[lo];
}

static bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

bool nm_utf8_validate(const uint8_t *s, size_t n, size_t *bad_offset, const char **reason) {
    size_t i = 0;
    while (i < n) {
        /* eight ASCII bytes at a time, the common case */
        if (n - i >= 8) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if ((w & 0x8080808080808080ull) == 0) {
                i += 8;
                continue;
            }
        }
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        size_t len = 1;
        uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        const char *why = NULL;
        if (b < 0xC0)
            why = "stray continuation byte";
        else if (b < 0xC2)
            why = "overlong encoding";
        else if (b < 0xE0)
            len = 2;
        else if (b < 0xF0) {
            len = 3;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;
        } else if (b < 0xF5) {
            len = 4;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;
        } else
            why = "byte that cannot start a code point at or below U+10FFFF";
        if (!why) {
            if (n - i < len) {
                /* say what the bytes that are there already mean */
                why = "sequence truncated by the end of the text";
                for (size_t k = 1; k < n - i; k++)
                    if (!is_continuation(s[i + k])) why = "missing continuation byte";
            } else if (s[i + 1] < lo || s[i + 1] > hi) {
                if (!is_continuation(s[i + 1]))
                    why = "missing continuation byte";
                else if (b == 0xED)
                    why = "UTF-16 surrogate (U+D800..U+DFFF)";
                else if (b == 0xF4)
                    why = "code point above U+10FFFF";
                else
                    why = "overlong encoding";
            } else {
                for (size_t k = 2; k < len; k++)
                    if (!is_continuation(s[i + k])) why = "missing continuation byte";
            }
        }
        if (why) {
            *bad_offset = i;
            *reason = why;
            return false;
        }
        i += len;
    }
    return true;
}

uint32_t nm_utf8_next(const uint8_t *s, size_t *pos) {
    size_t i = *pos;
    uint8_t b = s[i];
    if (b < 0x80) {
        *pos = i + 1;
        return b;
    }
    if (b < 0xE0) {
        *pos = i + 2;
        return ((uint32_t)(b & 0x1F) << 6) | (s[i + 1] & 0x3F);
    }
    if (b < 0xF0) {
        *pos = i + 3;
        return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) |
               (s[i + 2] & 0x3F);
    }
    *pos = i + 4;
    return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
           ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
}

int nm_utf8_encode(uint32_t cp, uint8_t out[4]) {
    NM_ASSERT(cp <= 0x10FFFF);
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2's bytes_to_unicode(): '!'..'~', U+00A1..U+00AC and U+00AE..U+00FF
 * keep their value; the 68 other bytes, in increasing order (0x00..0x20,
 * 0x7F..0xA0, 0xAD), become U+0100, U+0101, ... */
static bool byte_is_printable(uint8_t b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

uint32_t nm_gpt2_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    if (b <= 0x20) return 0x100 + b;
    if (b <= 0xA0) return 0x100 + 33 + (b - 0x7F);
    return 0x100 + 33 + 34; /* 0xAD */
}

int nm_gpt2_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return byte_is_printable((uint8_t)cp) ? (int)cp : -1;
    if (cp < 0x100 + 33) return (int)(cp - 0x100);
    if (cp < 0x100 + 33 + 34) return (int)(cp - 0x100 - 33 + 0x7F);
    if (cp == 0x100 + 33 + 34) return 0xAD;
    return -1;
}
