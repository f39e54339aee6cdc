/* The public chat-template function (npumoe.h) over tokenizer/chat.c: the
 * model's template recognised, or a format by name. */
#include "engine.h"

#include "base/base.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

nm_status nm_chat_apply_template(const nm_model *model, const char *tmpl,
                                 const nm_chat_message *messages, size_t n_messages,
                                 bool add_generation_prompt, char **out, size_t *n_out,
                                 nm_error *err) {
    *out = NULL;
    *n_out = 0;
    nm_chat_format f;
    nm_status st = tmpl    ? nm_chat_format_parse(tmpl, &f, err)
                   : model ? nm_chat_detect(model->gguf, &f, err)
                           : nm_errorf(err, NM_ERR_INVALID_ARG, "no model and no chat format");
    if (st != NM_OK) return st;
    return nm_chat_render(f, messages, n_messages, add_generation_prompt, out, n_out, err);
}
