/* Chat templates: the real templates of Qwen3 (qwen3-vocab.gguf) and
 * Phi-3.5-MoE (llama2-vocab.gguf, tiny-phimoe), and one with harmony's
 * markers, are recognised (harmony renders the strings ik_llama.cpp's and
 * llama.cpp's llama_chat_apply_template give); a file
 * without one, and one with a template npumoe does not know, are errors
 * that name the fallback; each format renders exactly the text its template
 * writes (strings written out from the templates); and the rendered
 * Phi-3.5 and Qwen3 prompts tokenize to the chat-formatted prompts of the
 * goldens (tiny-phimoe and tiny-qwen3moe prompt 2, 32-token prefixes made by
 * llama.cpp). Conversations: several turns with earlier answers, with and
 * without the generation prompt, and the public nm_chat_apply_template on
 * the model's template, a named one, and bad messages. */
#include "harness.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

static const char *SYSTEM = "You are a helpful assistant.";
static const char *USER = "Explain what a mixture-of-experts layer does, in two sentences, and "
                          "give one example of where it helps.";

static nm_gguf *open_file(const char *path) {
    nm_gguf *g = NULL;
    nm_error err = {0};
    nm_status st = nm_gguf_open(path, &g, &err);
    if (st != NM_OK) fprintf(stderr, "%s\n", err.msg);
    CHECK_INT_EQ(st, NM_OK);
    return g;
}

static void check_detect(const char *path, nm_status want_st, nm_chat_format want) {
    nm_gguf *g = open_file(path);
    if (!g) return;
    nm_chat_format f = NM_CHAT_COUNT;
    nm_error err = {0};
    nm_status st = nm_chat_detect(g, &f, &err);
    CHECK_INT_EQ(st, want_st);
    if (st == NM_OK) CHECK_INT_EQ(f, want);
    if (st != NM_OK) {
        printf("%s: %s\n", path, err.msg);
        CHECK(strstr(err.msg, "--chat-template") != NULL);
    }
    nm_gguf_close(g);
}

static void check_render(nm_chat_format f, const char *system, const char *want) {
    char *got = NULL;
    size_t n = 0;
    nm_error err = {0};
    CHECK_INT_EQ(nm_chat_apply(f, system, "Hi there", &got, &n, &err), NM_OK);
    nm_test_checks++;
    if (!got || n != strlen(want) || memcmp(got, want, n) != 0) {
        nm_test_failures++;
        fprintf(stderr, "%s: rendered\n[%s]\nwant\n[%s]\n", nm_chat_format_name(f),
                got ? got : "(null)", want);
    }
    nm_free(got);
}

/* The first 32 ids of the rendered chat against the golden prompt 2. */
static void check_prompt(const char *model_dir, nm_chat_format f) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/model.gguf", NM_VECTORS_DIR, model_dir);
    nm_gguf *g = open_file(path);
    if (!g) return;
    nm_error err = {0};
    nm_tokenizer *tok = NULL;
    CHECK_INT_EQ(nm_tokenizer_load(g, &tok, &err), NM_OK);
    char *text = NULL;
    size_t n_text = 0;
    CHECK_INT_EQ(nm_chat_apply(f, SYSTEM, USER, &text, &n_text, &err), NM_OK);
    int32_t ids[256];
    size_t n = 0;
    if (tok && text)
        CHECK_INT_EQ(nm_tokenizer_encode(tok, text, n_text, nm_tokenizer_add_bos(tok), true, ids,
                                         256, &n, &err),
                     NM_OK);
    snprintf(path, sizeof path, "%s/%s/prompts.txt", NM_VECTORS_DIR, model_dir);
    size_t n_file = 0;
    char *file = (char *)nm_test_read_file(path, &n_file);
    CHECK(file != NULL);
    char *line = file ? strchr(file, '\n') : NULL;
    line = line ? strchr(line + 1, '\n') : NULL; /* prompt 2 is the third line */
    int same = 0, k = 0;
    for (char *p = line ? line + 1 : NULL; p && *p && *p != '\n' && k < 32; k++) {
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p) break;
        same += (size_t)k < n && ids[k] == id;
        p = end;
    }
    printf("%s chat prompt: %d of the golden's first %d ids identical (%zu ids)\n", model_dir, same,
           k, n);
    CHECK_INT_EQ(k, 32);
    CHECK_INT_EQ(same, 32);
    free(file);
    nm_free(text);
    nm_tokenizer_free(tok);
    nm_gguf_close(g);
}

/* A two-turn conversation rendered in f, with or without the generation
 * prompt. */
static void check_turns(nm_chat_format f, bool gen, const char *want) {
    const nm_chat_message m[4] = {
        {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "And?"}};
    char *out = NULL;
    size_t n = 0;
    nm_error err = {0};
    CHECK_INT_EQ(nm_chat_render(f, m, 4, gen, &out, &n, &err), NM_OK);
    CHECK(out && n == strlen(want) && strcmp(out, want) == 0);
    if (out && strcmp(out, want) != 0) fprintf(stderr, "rendered\n[%s]\nwant\n[%s]\n", out, want);
    nm_free(out);
}

/* The public entry: the model's template, a name, and what it refuses. */
static void check_public_template(void) {
    nm_model_params mp = nm_model_default_params();
    mp.vocab_only = true;
    nm_model *model = NULL;
    nm_error err = {0};
    CHECK_INT_EQ(nm_model_load(NM_VECTORS_DIR "/qwen3-vocab.gguf", &mp, &model, &err), NM_OK);
    const nm_chat_message m[1] = {{"user", "Hi there"}};
    char *out = NULL;
    size_t n = 0;
    CHECK_INT_EQ(nm_chat_apply_template(model, NULL, m, 1, true, &out, &n, &err), NM_OK);
    CHECK(out && strcmp(out, "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n") == 0);
    nm_free(out);
    CHECK_INT_EQ(nm_chat_apply_template(NULL, "phi3", m, 1, false, &out, &n, &err), NM_OK);
    CHECK(out && strcmp(out, "<|user|>\nHi there<|end|>\n") == 0);
    nm_free(out);
    CHECK_INT_EQ(nm_chat_apply_template(NULL, NULL, m, 1, true, &out, &n, &err),
                 NM_ERR_INVALID_ARG);
    CHECK_INT_EQ(nm_chat_apply_template(model, NULL, m, 0, true, &out, &n, &err),
                 NM_ERR_INVALID_ARG);
    const nm_chat_message late[2] = {{"user", "Hi"}, {"system", "Be brief."}};
    CHECK_INT_EQ(nm_chat_apply_template(model, NULL, late, 2, true, &out, &n, &err),
                 NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "system first only") != NULL);
    const nm_chat_message bad[1] = {{"tool", "x"}};
    CHECK_INT_EQ(nm_chat_apply_template(model, NULL, bad, 1, true, &out, &n, &err),
                 NM_ERR_INVALID_ARG);
    CHECK(out == NULL);
    nm_model_free(model);
    /* a vocabulary without a template: not found, naming the fallback */
    CHECK_INT_EQ(nm_model_load(NM_VECTORS_DIR "/mistral-vocab.gguf", &mp, &model, &err), NM_OK);
    CHECK_INT_EQ(nm_chat_apply_template(model, NULL, m, 1, true, &out, &n, &err), NM_ERR_NOT_FOUND);
    CHECK(strstr(err.msg, "--chat-template") != NULL);
    nm_model_free(model);
}

/* nm_chat_detect on an in-memory file whose only key is the template. */
static nm_status detect_template(const char *tmpl, nm_chat_format *f, nm_error *err) {
    nm_status st = NM_ERR_NOMEM;
    nm_gguf_writer *w = nm_gguf_writer_new();
    uint8_t *mem = NULL;
    size_t n = 0;
    nm_gguf *g = NULL;
    if (w && nm_gguf_writer_set_str(w, "tokenizer.chat_template", tmpl) == NM_OK &&
        nm_gguf_writer_to_memory(w, &mem, &n, err) == NM_OK &&
        nm_gguf_open_memory(mem, n, &g, err) == NM_OK)
        st = nm_chat_detect(g, f, err);
    nm_gguf_close(g);
    nm_free(mem);
    nm_gguf_writer_free(w);
    return st;
}

/* A template with harmony's <|start|> and <|channel|> (a piece of
 * gpt-oss's) is recognised as harmony. */
static void check_harmony_detect(void) {
    nm_chat_format f = NM_CHAT_COUNT;
    nm_error err = {0};
    CHECK_INT_EQ(
        detect_template("{{- \"<|start|>assistant<|channel|>final<|message|>\" }}", &f, &err),
        NM_OK);
    CHECK_INT_EQ(f, NM_CHAT_HARMONY);
}

/* DeepSeek-V2-Chat's template (from its tokenizer_config.json) is
 * recognised by the line llama.cpp recognises it by. */
static void check_deepseek2_detect(void) {
    static const char tmpl[] =
        "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
        "{% endif %}{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' "
        "%}{{ 'User: ' + message['content'] + '\n\n' }}{% elif message['role'] == 'assistant' "
        "%}{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == "
        "'system' %}{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}{% if "
        "add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";
    nm_chat_format f = NM_CHAT_COUNT;
    nm_error err = {0};
    CHECK_INT_EQ(detect_template(tmpl, &f, &err), NM_OK);
    CHECK_INT_EQ(f, NM_CHAT_DEEPSEEK2);
    CHECK_INT_EQ(nm_chat_format_parse("deepseek2", &f, &err), NM_OK);
    CHECK_INT_EQ(f, NM_CHAT_DEEPSEEK2);
}

static void check_unknown_template(void) {
    nm_chat_format f;
    nm_error err = {0};
    CHECK_INT_EQ(
        detect_template("{% for m in messages %}<<{{ m.content }}>>{% endfor %}", &f, &err),
        NM_ERR_UNSUPPORTED);
    printf("unknown template: %s\n", err.msg);
    CHECK(strstr(err.msg, "--chat-template chatml|phi3|mistral|deepseek2|harmony") != NULL);
}

int main(void) {
    check_detect(NM_VECTORS_DIR "/qwen3-vocab.gguf", NM_OK, NM_CHAT_CHATML);
    check_detect(NM_VECTORS_DIR "/llama2-vocab.gguf", NM_OK, NM_CHAT_PHI3);
    check_detect(NM_VECTORS_DIR "/tiny-phimoe/model.gguf", NM_OK, NM_CHAT_PHI3);
    check_detect(NM_VECTORS_DIR "/tiny-olmoe/model.gguf", NM_OK, NM_CHAT_CHATML);
    check_detect(NM_VECTORS_DIR "/mistral-vocab.gguf", NM_ERR_NOT_FOUND, NM_CHAT_COUNT);
    check_unknown_template();

    check_render(NM_CHAT_CHATML, NULL,
                 "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
    check_render(NM_CHAT_CHATML, "Be brief.",
                 "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi "
                 "there<|im_end|>\n<|im_start|>assistant\n");
    check_render(NM_CHAT_PHI3, "", "<|user|>\nHi there<|end|>\n<|assistant|>\n");
    check_render(NM_CHAT_PHI3, "Be brief.",
                 "<|system|>\nBe brief.<|end|>\n<|user|>\nHi there<|end|>\n<|assistant|>\n");
    check_render(NM_CHAT_MISTRAL, NULL, "[INST] Hi there [/INST]");
    check_render(NM_CHAT_MISTRAL, "Be brief.", "[INST] Be brief.\n\nHi there [/INST]");
    check_render(NM_CHAT_DEEPSEEK2, NULL, "User: Hi there\n\nAssistant:");
    check_render(NM_CHAT_DEEPSEEK2, "Be brief.", "Be brief.\n\nUser: Hi there\n\nAssistant:");
    check_deepseek2_detect();
    /* harmony: the strings llama_chat_apply_template("gpt-oss", ...) gives in
     * ik_llama.cpp 8337e4cd and in llama.cpp d32676d77 (the same bytes) */
    check_render(NM_CHAT_HARMONY, NULL,
                 "<|start|>user<|message|>Hi there<|end|><|start|>assistant");
    check_render(NM_CHAT_HARMONY, "Be brief.",
                 "<|start|>system<|message|>Be brief.<|end|><|start|>user<|message|>Hi "
                 "there<|end|><|start|>assistant");
    check_render(NM_CHAT_HARMONY, "",
                 "<|start|>system<|message|><|end|><|start|>user<|message|>Hi "
                 "there<|end|><|start|>assistant");
    check_harmony_detect();

    nm_chat_format f;
    nm_error err = {0};
    CHECK_INT_EQ(nm_chat_format_parse("qwen3", &f, &err), NM_OK);
    CHECK_INT_EQ(f, NM_CHAT_CHATML);
    CHECK_INT_EQ(nm_chat_format_parse("jinja", &f, &err), NM_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "phi3") != NULL);

    check_turns(NM_CHAT_CHATML, true,
                "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n"
                "<|im_start|>assistant\n");
    check_turns(NM_CHAT_CHATML, false,
                "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n");
    check_turns(NM_CHAT_PHI3, true,
                "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n"
                "<|user|>\nAnd?<|end|>\n<|assistant|>\n");
    check_turns(NM_CHAT_HARMONY, true,
                "<|start|>system<|message|>Be brief.<|end|><|start|>user<|message|>Hi<|end|>"
                "<|start|>assistant<|message|>Hello.<|return|><|start|>user<|message|>And?<|end|>"
                "<|start|>assistant");
    check_turns(NM_CHAT_HARMONY, false,
                "<|start|>system<|message|>Be brief.<|end|><|start|>user<|message|>Hi<|end|>"
                "<|start|>assistant<|message|>Hello.<|return|><|start|>user<|message|>And?<|end|>");
    CHECK_INT_EQ(nm_chat_format_parse("gpt-oss", &f, &err), NM_OK);
    CHECK_INT_EQ(f, NM_CHAT_HARMONY);
    check_turns(NM_CHAT_MISTRAL, true,
                "[INST] Be brief.\n\nHi [/INST]Hello.</s>[INST] And? [/INST]");
    check_public_template();

    check_prompt("tiny-phimoe", NM_CHAT_PHI3);
    check_prompt("tiny-qwen3moe", NM_CHAT_CHATML);
    return nm_test_finish("test_chat");
}
