#!/usr/bin/env python3
"""What the npumoe command does with the files and streams around it (issue
11): outputs that are devices, FIFOs, symbolic links, directories or sockets;
a FIFO given as the model; standard output that cannot be written or is
closed early; output paths checked before the work; empty inputs.

Usage: test_cli_io.py NPUMOE --model GGUF (models/npumoe-tiny-moe.gguf) --vectors DIR
Each case states what it checks; every one of them failed before issue 11.
"""
import argparse
import json
import math
import os
import re
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time

import test_cli  # its check() counts passes and failures
from test_cli import check


def run(binary, args, stdout=subprocess.PIPE, timeout=300):
    return subprocess.run([binary] + args, stdout=stdout, stderr=subprocess.PIPE,
                          timeout=timeout)


def one_error(r, needle):
    """Exit 1, and the last line on stderr (after any progress lines) the one
    'npumoe: ...' line, naming needle."""
    err = r.stderr.decode("utf-8", "replace")
    lines = [l for l in err.replace("\r", "\n").splitlines() if l.strip()]
    ours = [l for l in lines if l.startswith("npumoe: ")]
    return (r.returncode == 1 and len(ours) == 1 and lines[-1] == ours[0]
            and needle.lower() in ours[0].lower()), f"exit {r.returncode}, stderr {err[-400:]!r}"


def expect_error(binary, args, needle, what, **kw):
    ok, detail = one_error(run(binary, args, **kw), needle)
    check(ok, f"{what}: exit 1 with one line naming '{needle}'", detail)


def is_chr(path):
    return stat.S_ISCHR(os.lstat(path).st_mode)


def private_device(tmp, name, minor):
    """A node of /dev/full (minor 7) or /dev/null (3) in tmp when we may make
    one (root, a file system that allows devices), so that a command that
    wrongly replaces the device replaces only ours; else the system's."""
    path = os.path.join(tmp, name)
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
        with open(path, "wb") as f:
            f.write(b"x")
            f.flush()
        return path if minor == 3 else "/dev/" + name
    except OSError as e:
        if minor == 7 and e.errno == 28 and os.path.exists(path):  # ENOSPC: a working /dev/full
            return path
        if os.path.lexists(path):
            os.unlink(path)
        return "/dev/" + name


def read_fifo(path, sink):
    with open(path, "rb") as f:
        sink.append(f.read())


def test_outputs(b, a, tmp, text):
    """Item 1: rename over a regular file or a new name only, follow a symbolic
    link, write a character device or FIFO directly, refuse anything else."""
    m = a.model
    full, null = private_device(tmp, "full", 7), private_device(tmp, "null", 3)
    q = ["quantize", "-m", m, "--type", "q8_0", "-o"]
    # a character device: written directly, so /dev/full fails and stays a device
    r = run(b, q + [full])
    ok, detail = one_error(r, "no space left")
    check(ok and is_chr(full), "quantize -o /dev/full fails and /dev/full stays a device",
          detail)
    r = run(b, q + [null])
    check(r.returncode == 0 and is_chr(null), "quantize -o /dev/null is a dry run",
          r.stderr.decode()[-300:])
    # the same for calibrate and plan (the first makes the calibration the plan needs)
    calib, prof = os.path.join(tmp, "c.json"), os.path.join(tmp, "p.json")
    cal = ["calibrate", "-m", m, "-f", text, "--chunk", "32", "-c", "128", "-o"]
    r = run(b, cal + [full])
    ok, detail = one_error(r, "no space left")
    check(ok and is_chr(full), "calibrate -o /dev/full fails, /dev/full stays a device",
          detail)
    r = run(b, cal + [calib])
    check(r.returncode == 0, "calibrate writes a calibration", r.stderr.decode()[-300:])
    r = run(b, ["profile", "-m", m, "--chunk", "32", "--reps", "1", "--grid-experts", "1,2",
                "--grid-capacity", "4,32", "-o", prof])
    check(r.returncode == 0, "profile writes a profile", r.stderr.decode()[-300:])
    pl = ["plan", "-m", m, "--calib", calib, "--profile", prof, "-o"]
    r = run(b, pl + [full])
    ok, detail = one_error(r, "no space left")
    check(ok and is_chr(full), "plan -o /dev/full fails, /dev/full stays a device", detail)
    r = run(b, pl + [null])
    check(r.returncode == 0 and is_chr(null), "plan -o /dev/null succeeds",
          r.stderr.decode()[-300:])
    # a FIFO: written directly to its reader, and still a FIFO afterwards
    fifo = os.path.join(tmp, "plan.fifo")
    os.mkfifo(fifo)
    got = []
    t = threading.Thread(target=read_fifo, args=(fifo, got), daemon=True)
    t.start()
    r = run(b, pl + [fifo])
    t.join(60)
    if t.is_alive():  # npumoe never opened it: release the reader rather than hang
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(10)
    check(r.returncode == 0 and stat.S_ISFIFO(os.lstat(fifo).st_mode) and got
          and got[0].startswith(b"{") and b"npumoe-plan" in got[0],
          "plan -o FIFO writes the plan to the reader and leaves the FIFO",
          r.stderr.decode()[-300:])
    # a symbolic link: the file it points to gets the output, the link stays
    real, link = os.path.join(tmp, "real.json"), os.path.join(tmp, "link.json")
    with open(real, "w") as f:
        f.write("old")
    os.symlink("real.json", link)
    r = run(b, pl + [link])
    check(r.returncode == 0 and os.path.islink(link) and os.readlink(link) == "real.json"
          and b"npumoe-plan" in open(real, "rb").read(),
          "plan -o LINK writes where the link points and keeps the link", r.stderr.decode()[-300:])
    real_q, link_q = os.path.join(tmp, "real.gguf"), os.path.join(tmp, "link.gguf")
    open(real_q, "wb").close()
    os.symlink(real_q, link_q)
    r = run(b, q + [link_q])
    check(r.returncode == 0 and os.path.islink(link_q) and os.path.getsize(real_q) > 1000000
          and open(real_q, "rb").read(4) == b"GGUF",
          "quantize -o LINK writes where the link points and keeps the link",
          r.stderr.decode()[-300:])
    # no stray temporary files beside the targets
    left = [n for n in os.listdir(tmp) if ".tmp" in n]
    print(f"devices used: {full}, {null}")
    check(not left, "no temporary files are left behind", str(left))
    # refused: a link to nothing, a directory, a socket
    dangling = os.path.join(tmp, "dangling.json")
    os.symlink("missing.json", dangling)
    expect_error(b, pl + [dangling], "symbolic link to a missing file", "plan -o a dangling link")
    check(os.path.islink(dangling) and not os.path.exists(os.path.join(tmp, "missing.json")),
          "a dangling link is left as it was")
    d = os.path.join(tmp, "adir")
    os.mkdir(d)
    expect_error(b, q + [d], "is a directory", "quantize -o a directory")
    expect_error(b, pl + [d], "is a directory", "plan -o a directory")
    sock_path = os.path.join(tmp, "s.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock_path)
    expect_error(b, pl + [sock_path], "is a socket", "plan -o a socket")
    expect_error(b, q + [sock_path], "is a socket", "quantize -o a socket")
    check(stat.S_ISSOCK(os.lstat(sock_path).st_mode), "the socket is left as it was")
    s.close()
    # logits writes by the same rules
    r = run(b, ["logits", "-m", m, "-p", "In the beginning", "-o", full])
    ok, detail = one_error(r, "no space left")
    check(ok and is_chr(full), "logits -o /dev/full fails, /dev/full stays a device",
          detail)
    expect_error(b, ["logits", "-m", m, "-p", "x", "-o", d], "is a directory",
                 "logits -o a directory")


def test_fifo_model(b, tmp):
    """Item 2: a FIFO as the model is refused at once, not read forever."""
    fifo = os.path.join(tmp, "model.fifo")
    os.mkfifo(fifo)
    for cmd in [["info"], ["tokenize", "-p", "x"], ["quantize", "--type", "q8_0", "-o",
                                                    os.path.join(tmp, "q.gguf")]]:
        try:
            r = run(b, [cmd[0], "-m", fifo] + cmd[1:], timeout=30)
            ok, detail = one_error(r, "not a regular file")
        except subprocess.TimeoutExpired:
            ok, detail = False, "still waiting after 30 s"
        check(ok, f"{cmd[0]} -m FIFO is refused at once", detail)


def test_stdout(b, a, text):
    """Item 3: a failed write of standard output is an error (exit 1, one
    line); a closed pipe ends the command quietly."""
    m = a.model
    cases = {
        "run": ["run", "-m", m, "-p", "In the beginning", "-n", "4", "--seed", "1"],
        "run --json": ["run", "-m", m, "-p", "In the beginning", "-n", "4", "--seed", "1",
                       "--json"],
        "tokenize": ["tokenize", "-m", m, "-p", "In the beginning"],
        "info": ["info", "-m", m],
        "bench": ["bench", "-m", m, "-p", "16", "-n", "2", "-r", "1"],
        "perplexity --json": ["perplexity", "-m", m, "-f", text, "-c", "128", "--json"],
        "--help": ["run", "--help"],
    }
    with open("/dev/full", "wb") as full:
        for what, args in cases.items():
            ok, detail = one_error(run(b, args, stdout=full), "standard output")
            check(ok, f"{what} > /dev/full fails with one line", detail)
    # a reader that goes away: no message, whatever the command was writing
    p = subprocess.Popen([b, "run", "-m", m, "-p", "In the beginning", "-n", "200", "--seed",
                          "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.read(1)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(120)
    check("npumoe:" not in err and p.returncode != 0,
          "run into a closed pipe ends without an error message",
          f"exit {p.returncode}, stderr {err[-300:]!r}")


def test_check_first(b, a, tmp, text):
    """Item 4: an output that cannot be created fails before the work."""
    m = a.model
    bad = os.path.join(tmp, "no", "such", "dir")
    r = run(b, ["calibrate", "-m", m, "-f", text, "--chunk", "32", "-c", "128", "-o",
                os.path.join(bad, "c.json")])
    ok, detail = one_error(r, "cannot create")
    check(ok and b"calibrate:" not in r.stderr, "calibrate fails before calibrating", detail)
    r = run(b, ["profile", "-m", m, "--chunk", "32", "--reps", "1", "-o",
                os.path.join(bad, "p.json")])
    ok, detail = one_error(r, "cannot create")
    check(ok and b"profile:" not in r.stderr, "profile fails before measuring", detail)
    r = run(b, ["bench", "-m", m, "-f", text, "--lengths", "32", "--modes", "dense", "-r", "1",
                "-o", os.path.join(bad, "bench")])
    ok, detail = one_error(r, "cannot create")
    check(ok and not r.stdout, "bench -o fails before benchmarking", detail)
    r = run(b, ["logits", "-m", m, "-p", "x", "-o", os.path.join(bad, "l.f32")])
    check(one_error(r, "cannot create")[0], "logits -o an impossible path fails",
          r.stderr.decode())


def test_empty(b, a, tmp):
    """Item 5: no tensors to quantize, an empty prompt: refused everywhere."""
    empty = os.path.join(tmp, "no-tensors.gguf")
    with open(empty, "wb") as f:  # GGUF v3, no tensors, one key
        key, val = b"general.architecture", b"qwen3moe"
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 1))
        f.write(struct.pack("<Q", len(key)) + key + struct.pack("<IQ", 8, len(val)) + val)
    out = os.path.join(tmp, "empty-q.gguf")
    expect_error(b, ["quantize", "-m", empty, "-o", out, "--type", "q8_0"], "no tensors",
                 "quantize of a file without tensors")
    check(not os.path.exists(out), "no output for a file without tensors")
    for cmd in ["tokenize", "run"]:
        expect_error(b, [cmd, "-m", a.model, "-p", ""], "the prompt is empty", f"{cmd} -p ''")


def test_plans(b, a, tmp):
    """Item 6: a plan runs only on the model (weights included) and the
    device it was made for."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
    import gguf  # tests/ref/gguf.py
    m = a.model
    plan = os.path.join(tmp, "plan-a.json")
    r = run(b, ["plan", "-m", m, "--calib", os.path.join(tmp, "c.json"), "--profile",
                os.path.join(tmp, "p.json"), "-o", plan])
    check(r.returncode == 0, "a plan for the shipped model", r.stderr.decode()[-300:])
    # model B: the shipped model with every router's rows in reverse order:
    # the same names, types and shapes, other routing
    g = gguf.GGUFFile(m)
    data = bytearray(open(m, "rb").read())
    n_routers = 0
    for name, t in g.tensors.items():
        if "ffn_gate_inp" not in name:
            continue
        item = {0: 4, 1: 2, 30: 2}[t.type_id]
        row, start = t.ne[0] * item, g.data_offset + t.offset
        rows = [bytes(data[start + i * row:start + (i + 1) * row]) for i in range(t.ne[1])]
        data[start:start + row * t.ne[1]] = b"".join(reversed(rows))
        n_routers += 1
    other = os.path.join(tmp, "permuted-routers.gguf")
    with open(other, "wb") as f:
        f.write(data)
    check(n_routers == g.get("qwen3moe.block_count"), "every layer's router permuted")
    expect_error(b, ["run", "-m", other, "--plan", plan, "-p", "In the beginning", "-n", "1"],
                 "fingerprint", "a plan on a model of the same shapes with other router weights")
    # a plan whose device is another
    with open(plan) as f:
        text = f.read()
    check('"device": "cpu"' in text, "the plan names its device", text[:200])
    vk = os.path.join(tmp, "plan-vulkan.json")
    with open(vk, "w") as f:
        f.write(text.replace('"device": "cpu"', '"device": "vulkan"', 1))
    expect_error(b, ["run", "-m", m, "--plan", vk, "-p", "In the beginning", "-n", "1"],
                 "device 'vulkan', not for device 'cpu'", "a plan made for another device")
    r = run(b, ["run", "-m", m, "--plan", plan, "-p", "In the beginning", "-n", "1", "--seed", "1"])
    check(r.returncode == 0, "the plan runs on its own model and device", r.stderr.decode()[-300:])


def test_vocab_only(b, a):
    """Item 7: tokenize and info read vocabulary-only files, as
    llama-tokenize --vocab-only does; the ids are llama.cpp's."""
    repo_models = os.path.dirname(a.model)
    cases = [(os.path.join(repo_models, "qwen3-4k-vocab.gguf"), "qwen3-4k-tokenize.tsv"),
             (os.path.join(a.vectors, "qwen3-vocab.gguf"), "qwen3-tokenize.tsv"),
             (os.path.join(a.vectors, "llama2-vocab.gguf"), "llama2-tokenize.tsv")]
    for vocab, tsv in cases:
        with open(os.path.join(a.vectors, tsv), encoding="utf-8") as f:
            rows = [l.rstrip("\n").split("\t") for l in f if l.strip()][:12]
        bad = []
        for text_json, ids in rows:
            text = json.loads(text_json)
            r = run(b, ["tokenize", "-m", vocab, "-p", text])
            if r.returncode != 0 or r.stdout.decode().split() != ids.split():
                bad.append((text, ids, r.stdout.decode().strip(), r.stderr.decode()[-200:]))
        check(not bad and rows, "tokenize -m %s gives llama.cpp's ids (%d strings)"
              % (os.path.basename(vocab), len(rows)), str(bad[:2]))
        r = run(b, ["info", "-m", vocab])
        check(r.returncode == 0 and b"vocabulary only" in r.stdout and b"vocabulary:" in r.stdout,
              "info -m %s describes a vocabulary-only file" % os.path.basename(vocab),
              (r.stdout + r.stderr).decode()[-300:])
    expect_error(b, ["run", "-m", cases[0][0], "-p", "x"], "vocabulary-only",
                 "run on a vocabulary-only file")


def test_context(b, a, text):
    """Item 8: the trained context is the default window of perplexity when
    shorter than 512; a larger context is warned about; an over-long prompt
    names -c."""
    m = a.model
    r = run(b, ["info", "-m", m])
    trained = int(re.search(rb"context \(trained\): +(\d+)", r.stdout).group(1))
    check(trained == 256, "the shipped model was trained on 256 tokens", r.stdout.decode()[:300])
    r = run(b, ["perplexity", "-m", m, "-f", text])
    check(r.returncode == 0 and b"windows of 256 tokens" in r.stderr,
          "perplexity's windows default to the trained context", r.stderr.decode()[-300:])
    r = run(b, ["run", "-m", m, "-p", "In the beginning", "-n", "1", "-c", "65536", "--seed", "1"])
    check(r.returncode == 0 and b"warning: a context of 65536 tokens exceeds the 256" in r.stderr,
          "run -c 65536 warns that it exceeds the trained context", r.stderr.decode()[-300:])
    r = run(b, ["perplexity", "-m", m, "-f", text, "-c", "512"])
    check(r.returncode == 0 and b"exceeds the 256" in r.stderr,
          "perplexity -c 512 warns", r.stderr.decode()[-300:])
    r = run(b, ["run", "-m", m, "-p", "In the beginning", "-n", "1", "-c", "256", "--seed", "1"])
    check(r.returncode == 0 and b"warning" not in r.stderr, "no warning within the trained context",
          r.stderr.decode()[-300:])
    expect_error(b, ["run", "-m", m, "-p", "a b c d e f g h i j", "-c", "4"], "-c N",
                 "an over-long prompt names -c")
    r = run(b, ["bench", "-m", m, "-f", text, "--lengths", "128,512", "--modes", "dense", "-r", "1"])
    check(r.returncode == 0 and b"a context of 512 tokens exceeds the 256" in r.stderr
          and b"context of 128" not in r.stderr,
          "bench says which --lengths exceed the trained context", r.stderr.decode()[-300:])


def test_help(b):
    """Item 9: each command's help describes its own options, with defaults,
    in 80 columns."""
    cmds = ["info", "tokenize", "run", "logits", "perplexity", "compare", "calibrate", "profile",
            "plan", "bench", "quantize"]
    helps = {}
    for c in cmds:
        r = run(b, [c, "--help"])
        helps[c] = r.stdout.decode()
        long_lines = [l for l in helps[c].splitlines() if len(l) > 80]
        check(r.returncode == 0 and not long_lines, f"{c} --help fits 80 columns", str(long_lines[:2]))
    r = run(b, ["--help"])
    check(all(len(l) <= 80 for l in r.stdout.decode().splitlines()), "--help fits 80 columns")

    def option_text(help_text, name):
        """The help of option --name: its line and the indented lines after it."""
        lines = help_text.splitlines()
        # the options section only: a wrapped usage line may begin with --name too
        start = lines.index("options:") if "options:" in lines else 0
        for i, l in enumerate(lines):
            if i < start:
                continue
            if re.match(r"\s+(-\w, )?--%s\b" % re.escape(name), l):
                out = [l]
                for k in lines[i + 1:]:
                    if not k.startswith(" " * 32):
                        break
                    out.append(k)
                return " ".join(x.strip() for x in out)
        return ""
    check("F32/F16/BF16" in option_text(helps["quantize"], "model")
          and "F32/F16/BF16" not in option_text(helps["run"], "model"),
          "-m describes quantize's input only in quantize", option_text(helps["run"], "model"))
    outs = {c: option_text(helps[c], "output") for c in ["logits", "calibrate", "profile", "plan",
                                                         "bench", "quantize"]}
    check("logits" in outs["logits"] and "calibration" in outs["calibrate"]
          and "profile" in outs["profile"] and "plan" in outs["plan"]
          and "PREFIX" in outs["bench"] and "GGUF" in outs["quantize"]
          and "logits" not in outs["plan"] and "calibration" not in outs["quantize"],
          "-o describes each command's own output", str(outs))
    chunk = option_text(helps["calibrate"], "chunk")
    check("default 256" in chunk and "plan" not in chunk, "calibrate --chunk gives its default",
          chunk)
    check("--no-repack" not in helps["tokenize"], "tokenize does not list --no-repack")
    check("default 0.95" in option_text(helps["plan"], "quantile"), "plan --quantile gives its default")
    check("default: a random one" in option_text(helps["run"], "seed"), "run --seed says it is random")


def test_plan_quantile_default(b, tmp):
    """The default that plan --help states is the one plan uses."""
    with open(os.path.join(tmp, "plan-a.json")) as f:
        check(json.load(f).get("quantile") == 0.95, "a plan made without --quantile uses 0.95")


def timed(b, args):
    """run(), and the wall time it took."""
    t0 = time.monotonic()
    r = run(b, args)
    return r, time.monotonic() - t0


def at_most_every_5s(lines, seconds):
    """Progress into a pipe: the final line, and one per 5 s before it."""
    return 1 <= len(lines) <= 1 + int(seconds / 5)


def test_progress(b, a, text):
    """Item 10: progress is one line rewritten in place on a terminal, and a
    line every few seconds at most elsewhere."""
    m = a.model
    cal = ["calibrate", "-m", m, "-f", text, "--chunk", "32", "-c", "128", "-o", "/dev/null"]
    r, secs = timed(b, cal)
    lines = [l for l in r.stderr.decode().splitlines() if l.startswith("calibrate:")]
    check(r.returncode == 0 and at_most_every_5s(lines, secs) and "1568/1568" in lines[-1],
          "calibrate into a pipe: the final progress line, no line per window", str(lines))
    r, secs = timed(b, ["perplexity", "-m", m, "-f", text, "-c", "128"])
    lines = [l for l in r.stderr.decode().splitlines() if l.startswith("[")]
    check(r.returncode == 0 and at_most_every_5s(lines, secs) and lines[-1].startswith("[12/12]"),
          "perplexity into a pipe: the final progress line", str(lines))
    import pty
    master, slave = pty.openpty()
    p = subprocess.Popen([b] + cal, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    got = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    p.wait(120)
    os.close(master)
    prog = [l for l in got.split(b"\n") if b"calibrate:" in l]
    check(p.returncode == 0 and len(prog) == 1 and prog[0].count(b"\r") >= 5
          and b"1568/1568" in prog[0],
          "calibrate on a terminal: one line rewritten in place", repr(got[-300:]))


def test_run_prompt_seed(b, a):
    """Item 11: run shows the prompt before the generated text; the default
    seed is random and printed, --seed repeats a run."""
    m = a.model
    base = ["run", "-m", m, "-p", "In the beginning", "-n", "8", "--temp", "1"]
    r = run(b, base + ["--seed", "7"])
    check(r.returncode == 0 and r.stdout.startswith(b"In the beginning")
          and len(r.stdout) > len("In the beginning\n"), "run echoes the prompt", repr(r.stdout))
    r2 = run(b, base + ["--seed", "7", "--no-display-prompt"])
    check(r2.returncode == 0 and not r2.stdout.startswith(b"In the beginning")
          and r.stdout == b"In the beginning" + r2.stdout,
          "--no-display-prompt prints the generated text alone", repr(r2.stdout))
    seeds, outs = [], []
    for _ in range(2):
        r = run(b, base)
        mm = re.search(rb"sampler seed: +(\d+)", r.stderr)
        seeds.append(int(mm.group(1)) if mm else None)
        outs.append(r.stdout)
    check(None not in seeds and seeds[0] != seeds[1], "without --seed each run draws a seed and says it",
          str(seeds))
    if None not in seeds:
        r = run(b, base + ["--seed", str(seeds[0])])
        check(r.stdout == outs[0] and re.search(rb"sampler seed: +%d\n" % seeds[0], r.stderr),
              "--seed with the printed seed repeats the run", repr((r.stdout, outs[0])))


def test_oom_f16(b, a):
    """Item 12: the out-of-memory message states the size of the cache it
    tried, in the KV type asked for."""
    import resource

    def small_address_space():  # 2 GiB: the caches below (5.6 and 2.8 GiB) cannot fit
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    mib = {}
    for kv in ["f32", "f16"]:
        r = subprocess.run([b, "run", "-m", a.model, "-p", "x", "-n", "1", "-c", "1000000",
                            "--kv-type", kv, "--seed", "1"], capture_output=True, timeout=120,
                           preexec_fn=small_address_space)
        if b"AddressSanitizer" in r.stderr:  # its shadow memory needs more than the limit
            print("test_oom_f16: skipped under AddressSanitizer")
            return
        mm = re.search(rb"KV cache ([0-9.]+) MiB in (f16|f32)", r.stderr)
        mib[kv] = (float(mm.group(1)), mm.group(2).decode()) if mm and r.returncode == 1 else None
    check(mib["f32"] and mib["f16"] and mib["f16"][1] == "f16"
          and abs(mib["f16"][0] * 2 - mib["f32"][0]) < 0.2,
          "--kv-type f16's out-of-memory message states the f16 size (half the f32 one)", str(mib))


def test_bench_report(b, a, tmp, text):
    """Item 13: the TTFT plot has round ticks, a median point and a min-max
    bar per cell, the model and device in its title; the report warns about
    every cell whose repetitions spread too widely to trust a ratio."""
    prefix = os.path.join(tmp, "bench")
    r, secs = timed(b, ["bench", "-m", a.model, "-f", text, "--lengths", "64,128", "--modes",
                        "dense,naive", "-r", "3", "-o", prefix])
    check(r.returncode == 0, "bench writes its reports", r.stderr.decode()[-300:])
    if r.returncode != 0:
        return
    lines = [l for l in r.stderr.decode().splitlines() if l.startswith("bench: prompt")]
    check(at_most_every_5s(lines, secs) and "prompt 128" in lines[-1] and "rep 3/3" in lines[-1],
          "bench into a pipe: the final progress line, not one per repetition", str(lines))
    svg = open(prefix + ".svg").read()
    js = json.load(open(prefix + ".json"))
    md = open(prefix + ".md").read()
    check("TTFT by prompt length: npumoe-tiny-moe.gguf on cpu" in svg,
          "the plot's title names the model and the device", svg[:400])
    ticks = [float(x) for x in re.findall(r'class="tick"[^>]*>([^<]+)<', svg)]
    steps = {round(y - x, 9) for x, y in zip(ticks, ticks[1:])}
    step = steps.pop() if len(steps) == 1 else 0
    mant = step / 10 ** math.floor(math.log10(step)) if step > 0 else 0
    top = max(c["ttft_max_ms"] for c in js["results"])
    check(ticks and ticks[0] == 0 and not steps and round(mant, 6) in (1, 2, 5)
          and ticks[-1] >= top and ticks[-1] - step < top,
          "the plot's ticks are round, evenly spaced, and end just past the slowest run",
          "ticks %s, slowest %.3f" % (ticks, top))
    n_cells = len(js["results"])
    check(svg.count('class="median"') == n_cells and svg.count('class="range"') == n_cells,
          "a median point and a min-max bar per cell", "%d cells" % n_cells)
    wide = sorted((c["mode"], str(c["prompt"])) for c in js["results"]
                  if (c["ttft_max_ms"] - c["ttft_min_ms"]) / c["ttft_ms"] > 0.25)
    noted = sorted(re.findall(r"warning: (\w+) at prompt (\d+): the repetitions spread", md))
    check(wide == noted, "the report warns exactly about the cells spread over 25%",
          "wide %s, warned %s" % (wide, noted))
    # the demo and the README name the same binary, the one the tests build
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    demo = open(os.path.join(root, "tools", "demo.sh")).read()
    readme = open(os.path.join(root, "README.md")).read()
    check("np=./build/release/npumoe" in demo and "./build/release/npumoe run" in readme
          and "./build/npumoe" not in readme, "the demo and the README use build/release/npumoe")
    check("The quick brown fox" not in demo and "In the beginning" in demo,
          "the demo's prompt is in the language of the King James Bible")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("npumoe")
    ap.add_argument("--model", required=True, help="models/npumoe-tiny-moe.gguf")
    ap.add_argument("--vectors", required=True, help="the shared golden vectors")
    a = ap.parse_args()
    b = a.npumoe
    tmp = tempfile.mkdtemp(prefix="nm_cli_io_")
    text = os.path.join(tmp, "text.txt")
    with open(os.path.join(os.path.dirname(a.model), "heldout.txt"), encoding="utf-8") as f, \
            open(text, "w", encoding="utf-8") as g:
        g.write(f.read()[:6000])
    test_outputs(b, a, tmp, text)
    test_plans(b, a, tmp)
    test_fifo_model(b, tmp)
    test_stdout(b, a, text)
    test_check_first(b, a, tmp, text)
    test_empty(b, a, tmp)
    test_vocab_only(b, a)
    test_context(b, a, text)
    test_help(b)
    test_plan_quantile_default(b, tmp)
    test_progress(b, a, text)
    test_run_prompt_seed(b, a)
    test_oom_f16(b, a)
    test_bench_report(b, a, tmp, text)
    print(f"test_cli_io: {test_cli.passed} passed, {test_cli.failed} failed")
    return 1 if test_cli.failed else 0


if __name__ == "__main__":
    sys.exit(main())
