"""Writes a trained model and its tokenizer as a qwen3moe GGUF with the keys,
key order, tensor names, tensor order, shapes and types that llama.cpp's
convert_hf_to_gguf.py writes for Qwen3-MoE (the layout tools/gen_fixture.c
reproduces): matrices in the chosen type, 1-D norms and the router F32.
"""

import numpy as np

import gguf_writer as gw

ARCH = "qwen3moe"
FILE_TYPE = {"f32": 0, "f16": 1, "bf16": 32}  # general.file_type (llama_ftype)
GGML_TYPE = {"f32": gw.GGML_F32, "f16": gw.GGML_F16, "bf16": gw.GGML_BF16}


def tensors(model):
    """[(gguf name, torch tensor, is_matrix)] in the converter's order."""
    out = [("token_embd.weight", model.tok_embd, True)]
    for i, l in enumerate(model.layers):
        p = "blk.%d." % i
        out += [
            (p + "attn_norm.weight", l.attn_norm, False),
            (p + "attn_q.weight", l.wq, True),
            (p + "attn_k.weight", l.wk, True),
            (p + "attn_v.weight", l.wv, True),
            (p + "attn_output.weight", l.wo, True),
            (p + "attn_q_norm.weight", l.q_norm, False),
            (p + "attn_k_norm.weight", l.k_norm, False),
            (p + "ffn_norm.weight", l.ffn_norm, False),
            (p + "ffn_gate_inp.weight", l.router, False),  # the converter keeps the router F32
            (p + "ffn_gate_exps.weight", l.gate, True),
            (p + "ffn_down_exps.weight", l.down, True),
            (p + "ffn_up_exps.weight", l.up, True),
        ]
    out += [("output_norm.weight", model.output_norm, False), ("output.weight", model.output, True)]
    return out


def write_gguf(model, tok, path, dtype="f16", name="npumoe-tiny-moe"):
    c = model.c
    if tok.n_vocab != c.n_vocab:
        raise ValueError("tokenizer has %d tokens, model %d" % (tok.n_vocab, c.n_vocab))
    w = gw.Writer()
    w.add_str("general.architecture", ARCH)
    w.add_str("general.type", "model")
    w.add_str("general.name", name)
    w.add_u32(ARCH + ".block_count", c.n_layer)
    w.add_u32(ARCH + ".context_length", c.n_ctx)
    w.add_u32(ARCH + ".embedding_length", c.d_model)
    # HF's intermediate_size (a dense FFN width); no layer of this model is
    # dense. 3 x the expert width, as tools/gen_fixture.c writes.
    w.add_u32(ARCH + ".feed_forward_length", 3 * c.d_ff)
    w.add_u32(ARCH + ".attention.head_count", c.n_head)
    w.add_u32(ARCH + ".attention.head_count_kv", c.n_head_kv)
    w.add_f32(ARCH + ".rope.freq_base", c.rope_theta)
    w.add_f32(ARCH + ".attention.layer_norm_rms_epsilon", c.rms_eps)
    w.add_u32(ARCH + ".expert_count", c.n_expert)
    w.add_u32(ARCH + ".expert_used_count", c.n_expert_used)
    w.add_u32(ARCH + ".attention.key_length", c.head_dim)
    w.add_u32(ARCH + ".attention.value_length", c.head_dim)
    w.add_u32("general.file_type", FILE_TYPE[dtype])
    w.add_u32(ARCH + ".expert_feed_forward_length", c.d_ff)
    w.add_u32("general.quantization_version", 2)
    # The tokenizer, keyed as the converter writes a Qwen base model's:
    # <|endoftext|> is BOS, EOS and padding, and no BOS is added.
    w.add_str("tokenizer.ggml.model", "gpt2")
    w.add_str("tokenizer.ggml.pre", "qwen2")
    w.add_array("tokenizer.ggml.tokens", gw.STRING, tok.token_texts())
    w.add_array("tokenizer.ggml.token_type", gw.INT32, tok.token_types())
    w.add_array("tokenizer.ggml.merges", gw.STRING, tok.merge_texts())
    w.add_u32("tokenizer.ggml.eos_token_id", tok.eot)
    w.add_u32("tokenizer.ggml.padding_token_id", tok.eot)
    w.add_u32("tokenizer.ggml.bos_token_id", tok.eot)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    for tname, t, is_matrix in tensors(model):
        x = t.detach().cpu().float().numpy().astype(np.float32)
        w.add_tensor(tname, x, GGML_TYPE[dtype] if is_matrix else gw.GGML_F32)
    w.write(path)


def round_like_export(model, dtype):
    """Rounds the model's matrices in place to what the GGUF stores, so that
    PyTorch computes with exactly the exported weights."""
    import torch
    if dtype == "f32":
        return
    with torch.no_grad():
        for _, t, is_matrix in tensors(model):
            if not is_matrix:
                continue
            if dtype == "f16":
                t.copy_(t.half().float())
            else:
                bits = gw.f32_to_bf16_bits(t.detach().numpy()).astype(np.uint32) << 16
                t.copy_(torch.from_numpy(bits.view(np.float32).reshape(t.shape)))
