"""The command's options for architectures, semantics and chat prompts, as a
user meets them: --compat (phimoe's llama.cpp semantics reproduce the
golden logits through `npumoe logits`; the default differs; bad values are
refused), --chat with the file's template (the prompt ids are those of the
Phi-3.5 format, checked against ids written out by hand from the template
and the tokenizer goldens), --chat-template, and the errors that name the
fallback; `compare --candidate-compat` scores one semantics against the
other. qwen2moe (tests/vectors/tiny-qwen2moe): `logits` against llama.cpp's,
`info` names the shared expert, `run --chat` renders chatml. deepseek2
(tests/vectors/tiny-deepseek2*): `logits` against llama.cpp's, `info`, and
calibrate -> profile -> plan -> run --plan, the plan over the MoE layers.
`info` names the shared expert, `run --chat` renders chatml. gpt-oss
(tests/vectors/tiny-gptoss): `logits` against ik_llama.cpp's, `info`
names YaRN and the window.

Usage: /usr/bin/python3 tests/cli/test_arch_cli.py PATH/TO/npumoe --vectors DIR
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

failures = 0
checks = 0


def check(cond, what, detail=""):
    global failures, checks
    checks += 1
    if not cond:
        failures += 1
        print("FAIL: %s %s" % (what, detail))


def run(binary, args):
    p = subprocess.run([binary] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def expect_error(binary, args, needle, what):
    rc, out, err = run(binary, args)
    lines = err.strip().splitlines()
    check(rc != 0 and len(lines) == 1 and needle in err, what,
          "(rc %d, stderr %r)" % (rc, err[:300]))


def read_f32(path):
    with open(path, "rb") as f:
        data = f.read()
    return struct.unpack("<%df" % (len(data) // 4), data)


def max_rel(a, b, n_vocab, rows):
    worst = 0.0
    for r in rows:
        ra, rb = a[r * n_vocab:(r + 1) * n_vocab], b[rows.index(r) * n_vocab:(rows.index(r) + 1) * n_vocab]
        d = max(abs(x - y) for x, y in zip(ra, rb))
        worst = max(worst, d / max(abs(y) for y in rb))
    return worst


def golden_logits(binary, folder, extra, tol):
    """Prompt 1's logits at every position through `npumoe logits` against
    the goldens of tests/vectors/FOLDER (4099-token vocabulary); returns
    the model's path."""
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vectors", folder)
    model = os.path.join(d, "model.gguf")
    with open(os.path.join(d, "prompts.txt")) as f:
        prompt = f.read().splitlines()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "l.f32")
        rc, _, err = run(binary, ["logits", "-m", model, "--tokens", prompt, "--all", "-o", out] +
                         extra)
        check(rc == 0, "%s logits" % folder, err)
        if rc == 0:
            e = max_rel(read_f32(out), read_f32(os.path.join(d, "logits_1.f32")), 4099,
                        list(range(len(prompt.split()))))
            print("%s prompt 1: max rel vs the goldens %.3g" % (folder, e))
            check(e < tol, "%s logits distance %.3g" % (folder, e))
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("npumoe")
    ap.add_argument("--vectors", required=True)
    a = ap.parse_args()
    bin_ = os.path.abspath(a.npumoe)
    phi = os.path.join(a.vectors, "tiny-phimoe")
    phi_model = os.path.join(phi, "model.gguf")
    mixtral = os.path.join(a.vectors, "tiny-mixtral", "model.gguf")
    n_vocab = 32064
    with open(os.path.join(phi, "prompts.txt")) as f:
        prompt1 = f.read().splitlines()[1]
    rows = list(range(len(prompt1.split())))
    gold = read_f32(os.path.join(phi, "logits_1.f32"))

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "l.f32")
        # --compat llama.cpp reproduces llama.cpp's logits; the default does not
        for compat, want_close in (("llama.cpp", True), ("none", False)):
            rc, _, err = run(bin_, ["logits", "-m", phi_model, "--tokens", prompt1, "--all",
                                    "-o", out, "--compat", compat])
            check(rc == 0, "logits --compat %s" % compat, err)
            if rc == 0:
                e = max_rel(read_f32(out), gold, n_vocab, rows)
                print("tiny-phimoe prompt 1, --compat %s: max rel vs llama.cpp %.3g" % (compat, e))
                check((e < 1e-5) == want_close, "--compat %s distance %.3g" % (compat, e))

    # --chat: the Phi-3.5 format, tokenized as llama.cpp does (ids from the
    # llama2 vocab: <|system|> 32006, "\n" after a special is ▁ 29871 + <0x0A> 13)
    rc, out, err = run(bin_, ["run", "-m", phi_model, "-p", "Hi", "--chat", "--system", "Be brief.",
                              "-n", "2", "--temp", "0", "--json"])
    check(rc == 0, "run --chat", err)
    if rc == 0:
        ids = json.loads(out)["prompt_ids"]
        want = [32006, 29871, 13, 3629, 11473, 29889, 32007, 29871, 13, 32010, 29871, 13, 18567,
                32007, 29871, 13, 32001, 29871, 13]
        check(ids == want, "phi3 chat prompt ids", "%s" % ids)
    rc, out, err = run(bin_, ["run", "-m", mixtral, "-p", "Hi", "--chat", "--chat-template",
                              "mistral", "-n", "1", "--temp", "0", "--json"])
    check(rc == 0, "run --chat-template mistral", err)
    if rc == 0:
        # BOS, ▁[ INST ] ▁Hi ▁[ / INST ] as the mistral vocab spells them
        ids = json.loads(out)["prompt_ids"]
        check(ids[0] == 1 and len(ids) > 3, "mistral chat prompt starts with BOS", "%s" % ids)

    # compare: the same file under the two semantics, scored on a text
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "t.txt")
        with open(text, "w") as f:
            f.write("The quick brown fox jumps over the lazy dog. " * 40)
        for cand, far in (("llama.cpp", True), ("none", False)):
            rc, out, err = run(bin_, ["compare", "-m", phi_model, "-f", text, "--ctx", "64",
                                      "--candidate-compat", cand, "--json"])
            check(rc == 0, "compare --candidate-compat %s" % cand, err)
            if rc == 0:
                r = json.loads(out)
                print("tiny-phimoe as trained vs --candidate-compat %s: KL %.4g, top-1 %.3f" % (
                    cand, r["kl_mean"], r["top1_agreement"]))
                check((r["kl_mean"] > 0.01) == far and (r["top1_agreement"] < 0.99) == far,
                      "semantics distance", "%s" % r)

    # qwen2moe: the golden logits through the command, info, chatml
    q2_model = golden_logits(bin_, "tiny-qwen2moe", ["--compat", "llama.cpp"], 1e-5)
    rc, out, err = run(bin_, ["info", "-m", q2_model])
    check(rc == 0 and "architecture:        qwen2moe" in out and "shared expert:       d_ff 32" in out,
          "qwen2moe info", out + err)
    rc, out, err = run(bin_, ["run", "-m", q2_model, "-p", "Hi", "--chat", "-n", "2", "--temp", "0",
                              "--json"])
    check(rc == 0, "qwen2moe run --chat", err)
    if rc == 0:
        ids = json.loads(out)["prompt_ids"]
        # <|im_start|> user \n Hi <|im_end|> \n <|im_start|> assistant \n (4k Qwen vocab)
        check(ids[0] == 4097 and 4098 in ids and ids.count(4097) == 2, "qwen2moe chatml prompt ids",
              "%s" % ids)

    # deepseek2 (tests/vectors/tiny-deepseek2*): logits against llama.cpp's,
    # info, and the static loop: calibrate, profile, plan, run --plan; the
    # plan has entries for the MoE layers only and records where they start
    vec = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vectors")
    for name in ("tiny-deepseek2", "tiny-deepseek2-qlora"):
        d = os.path.join(vec, name)
        with open(os.path.join(d, "prompts.txt")) as f:
            prompt = f.read().splitlines()[1]
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "l.f32")
            rc, _, err = run(bin_, ["logits", "-m", os.path.join(d, "model.gguf"), "--tokens",
                                    prompt, "--all", "-o", out])
            check(rc == 0, "%s logits" % name, err)
            if rc == 0:
                e = max_rel(read_f32(out), read_f32(os.path.join(d, "logits_1.f32")), 4099,
                            list(range(len(prompt.split()))))
                print("%s prompt 1: max rel vs llama.cpp %.3g" % (name, e))
                check(e < 1e-5, "%s logits distance %.3g" % (name, e))
    ds = os.path.join(vec, "tiny-deepseek2", "model.gguf")
    # DeepSeek-V2's chat format by name (the tiny model carries Qwen's vocabulary
    # and template): "User: Hi\n\nAssistant:" in its ids, no <|im_start|>
    rc, out, err = run(bin_, ["run", "-m", ds, "-p", "Hi", "--chat", "--chat-template", "deepseek2",
                              "-n", "1", "--temp", "0", "--json"])
    check(rc == 0, "deepseek2 run --chat-template deepseek2", err)
    if rc == 0:
        ids = json.loads(out)["prompt_ids"]
        rc2, out2, err2 = run(bin_, ["tokenize", "-m", ds, "-p", "User: Hi\n\nAssistant:"])
        check(rc2 == 0 and 4097 not in ids, "deepseek2 chat prompt", out2 + err2)
        if rc2 == 0:
            want = [int(x) for x in out2.split()]
            check(ids == want, "deepseek2 chat prompt ids", "%s vs %s" % (ids, want))
    rc, out, err = run(bin_, ["info", "-m", ds])
    check(rc == 0 and "architecture:        deepseek2" in out
          and "kv_lora_rank 16, q_lora_rank 0" in out and "cache 20 floats per position" in out
          and "dense layers:        0..0" in out and "ungated" in out,
          "deepseek2 info", out + err)
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "t.txt")
        with open(text, "w") as f:
            f.write("The quick brown fox jumps over the lazy dog, 1234 times. " * 30)
        calib, prof, plan = (os.path.join(tmp, x) for x in ("c.json", "p.json", "plan.json"))
        rc, out, err = run(bin_, ["calibrate", "-m", ds, "-f", text, "--chunk", "16", "-o", calib])
        check(rc == 0, "deepseek2 calibrate", err[-300:])
        rc, out, err = run(bin_, ["profile", "-m", ds, "--chunk", "16", "--reps", "1",
                                  "--grid-experts", "1,4", "--grid-capacity", "4,16", "-o", prof])
        check(rc == 0, "deepseek2 profile", err[-300:])
        rc, out, err = run(bin_, ["plan", "-m", ds, "--calib", calib, "--profile", prof, "-o", plan])
        check(rc == 0, "deepseek2 plan", err[-300:])
        if rc == 0:
            with open(plan) as f:
                p = json.load(f)
            with open(calib) as f:
                c = json.load(f)
            check(p["n_layer"] == 26 and len(p["layers"]) == 26 and p["first_moe_layer"] == 1
                  and c["n_layer"] == 26,
                  "deepseek2 plan and calibration cover the 26 MoE layers from layer 1",
                  "%s %s %s" % (p["n_layer"], p.get("first_moe_layer"), c["n_layer"]))
            got = {}
            for how, extra in (("plan", ["--plan", plan]), ("dense", [])):
                rc, out, err = run(bin_, ["run", "-m", ds, "-p", "Hello there, " * 12, "-n", "4",
                                          "--temp", "0", "--json"] + extra)
                check(rc == 0, "deepseek2 run (%s)" % how, (out + err)[-400:])
                got[how] = json.loads(out)["generated_ids"] if rc == 0 else None
            # spilling (the default) loses nothing: the plan's tokens are dense's
            check(p["overflow"] != "spill" or got["plan"] == got["dense"],
                  "deepseek2 run --plan generates dense's tokens", "%s" % got)
            # a plan whose layers would start elsewhere is refused
            p["first_moe_layer"] = 0
            with open(plan + ".moved", "w") as f:
                json.dump(p, f)
            expect_error(bin_, ["run", "-m", ds, "--plan", plan + ".moved", "-p", "x"],
                         "start at the model's layer 0", "a plan over other layers")
            # the plan of one model refused by another
            expect_error(bin_, ["run", "-m", os.path.join(vec, "tiny-deepseek2-qlora", "model.gguf"),
                                "--plan", plan, "-p", "x"], "fingerprint",
                         "a deepseek2 plan for another model")
    # gpt-oss: the golden logits (ik_llama.cpp) through the command, info
    go_model = golden_logits(bin_, "tiny-gptoss", [], 5e-4)
    rc, out, err = run(bin_, ["info", "-m", go_model])
    check(rc == 0 and "architecture:        gpt-oss" in out and
          "rope scaling:        yarn, factor 32 over 4096 positions" in out and
          "a window of 16 keys" in out, "gpt-oss info", out + err)

    # errors, one line each, naming what to do
    expect_error(bin_, ["run", "-m", mixtral, "-p", "Hi", "--chat"], "--chat-template",
                 "no template in the file")
    expect_error(bin_, ["run", "-m", phi_model, "-p", "Hi", "--chat", "--chat-template", "jinja"],
                 "phi3", "unknown --chat-template")
    expect_error(bin_, ["run", "-m", phi_model, "--tokens", "1 2", "--chat"], "--chat",
                 "--chat with token ids")
    expect_error(bin_, ["run", "-m", phi_model, "-p", "Hi", "--system", "x"], "--chat",
                 "--system without --chat")
    expect_error(bin_, ["info", "-m", phi_model, "--compat", "hf"], "llama.cpp", "bad --compat")
    expect_error(bin_, ["logits", "-m", phi_model, "-p", "x", "--chat", "-o", "/dev/null"],
                 "chat", "--chat on a command without it")
    print("test_arch_cli: %d passed, %d failed" % (checks - failures, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
