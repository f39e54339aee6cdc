/* libFuzzer target: arbitrary bytes through nm_tokenizer_encode with the
 * tiny models' 4k Qwen3 vocabulary. The first input byte picks the options
 * (bit 0: parse_special, bit 1: add_bos), the rest is the text. Checks:
 * - the text is refused exactly when an independent UTF-8 check refuses it,
 *   and the reported offset ends a valid prefix;
 * - counting (NULL, 0) and filling agree;
 * - the pieces of the ids (special tokens rendered) give the text back.
 * The vocabulary is NM_FUZZ_TOKENIZER_VOCAB, or the tiny-qwen3moe model from
 * NM_VECTORS_DIR; it is loaded once per process (libFuzzer's state). CTest
 * runs it with both: fuzz_tokenizer_smoke (Qwen3) and
 * fuzz_tokenizer_gpt4o_smoke (the gpt-4o test vocabulary). */
#include "base/base.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef NM_VECTORS_DIR
#define NM_VECTORS_DIR "../shared/vectors"
#endif

static nm_gguf *vocab_file;
static const nm_tokenizer *tok;

static void fail(const char *what) {
    fprintf(stderr, "fuzz_tokenizer: %s\n", what);
    abort();
}

/* RFC 3629 by decoding and range checks, written apart from unicode.c. */
static bool valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t c = s[i], min;
        size_t len;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xE0) == 0xC0)
            len = 2, c &= 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0)
            len = 3, c &= 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0)
            len = 4, c &= 0x07, min = 0x10000;
        else
            return false;
        if (n - i < len) return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            c = c << 6 | (s[i + k] & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
        i += len;
    }
    return true;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("NM_FUZZ_TOKENIZER_VOCAB");
    if (!path) path = NM_VECTORS_DIR "/tiny-qwen3moe/model.gguf";
    nm_error err = {0};
    nm_tokenizer *t = NULL;
    if (nm_gguf_open(path, &vocab_file, &err) != NM_OK || nm_tokenizer_load(vocab_file, &t, &err))
        fail(err.msg);
    tok = t;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const bool parse_special = data[0] & 1, add_bos = data[0] & 2;
    const char *text = (const char *)data + 1;
    const size_t n = size - 1;

    size_t n_ids = 0;
    nm_error err = {0};
    nm_status st = nm_tokenizer_encode(tok, text, n, add_bos, parse_special, NULL, 0, &n_ids, &err);
    const bool valid = valid_utf8(data + 1, n);
    if (st == NM_ERR_FORMAT) {
        if (valid) fail("valid UTF-8 refused");
        const char *at = strstr(err.msg, "byte offset ");
        if (!at) fail("no offset in the UTF-8 error");
        const size_t offset = strtoull(at + 12, NULL, 10);
        if (offset >= n || !valid_utf8(data + 1, offset)) fail("wrong UTF-8 error offset");
        return 0;
    }
    if (!valid) fail("invalid UTF-8 accepted");
    if (st != NM_OK && st != NM_ERR_CAPACITY) fail(err.msg);
    if ((st == NM_OK) != (n_ids == 0)) fail("count status and count disagree");

    int32_t *ids = malloc((n_ids ? n_ids : 1) * sizeof *ids);
    char *back = malloc(n + 1);
    if (!ids || !back) fail("out of memory");
    size_t n_again = 0;
    st = nm_tokenizer_encode(tok, text, n, add_bos, parse_special, ids, n_ids, &n_again, &err);
    if (st != NM_OK || n_again != n_ids) fail("filling disagrees with counting");

    const size_t first = add_bos && nm_tokenizer_bos(tok) >= 0;
    if (first && ids[0] != nm_tokenizer_bos(tok)) fail("BOS missing");
    size_t len = 0;
    for (size_t i = first; i < n_ids; i++) {
        const size_t room = len <= n ? n + 1 - len : 0;
        const int32_t k = nm_tokenizer_piece(tok, ids[i], true, room ? back + len : NULL, room);
        if (k < 0) fail("id out of range");
        len += (size_t)k;
    }
    if (len != n || memcmp(back, text, n) != 0) fail("pieces do not give the text back");
    free(ids);
    free(back);
    return 0;
}
