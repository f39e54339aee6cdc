"""Byte-level BPE in pure Python, as GPT-2 and Qwen2 define it: text is split
by the qwen2 pre-tokenizer regex, each piece's UTF-8 bytes are spelled in the
GPT-2 byte-to-unicode alphabet, and merges are applied lowest rank first.
Trains a vocabulary (train) and encodes text with it (Tokenizer.encode), so
that the ids are what llama.cpp and npumoe give for the exported GGUF.
Not here: special-token parsing inside text (training data inserts
<|endoftext|> between documents by id) and normalisation (qwen2 has none).
"""

import heapq
from collections import Counter

try:
    import regex
except ImportError:  # the pre-tokenizer needs \p{L} and \p{N}
    raise SystemExit("error: the 'regex' module is required (Debian: apt-get install python3-regex)")

# The qwen2 pre-tokenizer (Qwen2/Qwen3 tokenizer.json; llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2).
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRETOKENIZE = regex.compile(QWEN2_PATTERN)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def bytes_to_unicode():
    """GPT-2's table: byte -> printable code point. Printable Latin-1 bytes
    map to themselves, the others to U+0100 onwards in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs))), bs


BYTE_TO_CHAR, BYTE_ORDER = bytes_to_unicode()


def spell(b: bytes) -> str:
    """Token text of a byte string in the GPT-2 alphabet."""
    return "".join(BYTE_TO_CHAR[x] for x in b)


def pretokenize(text):
    return PRETOKENIZE.findall(text)


def word_counts(texts):
    counts = Counter()
    for t in texts:
        counts.update(pretokenize(t))
    return counts


def train(texts, n_tokens, log=None):
    """Learns merges from texts until 256 byte tokens plus the distinct
    merge results number n_tokens. Returns the merges, each a pair of byte
    strings, in rank order. Deterministic: the most frequent pair wins, ties
    go to the smaller (left bytes, right bytes). Two merges can make the same
    bytes (a+bc, ab+c); both are kept, as in HF vocabularies."""
    counts = word_counts(texts)
    # Symbols are byte strings; every word is a list of them.
    words = [[bytes([b]) for b in w.encode("utf-8")] for w in sorted(counts)]
    freq = [counts[w] for w in sorted(counts)]
    pair_count = Counter()
    pair_words = {}
    for i, syms in enumerate(words):
        for p in zip(syms, syms[1:]):
            pair_count[p] += freq[i]
            pair_words.setdefault(p, set()).add(i)
    # Max-heap by count, then smallest pair; stale entries are skipped.
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    made = set(bytes([b]) for b in range(256))
    while len(made) < n_tokens and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or negc == 0:
            continue
        merges.append(pair)
        a, b = pair
        ab = a + b
        made.add(ab)
        changed = Counter()
        for i in sorted(pair_words.pop(pair, ())):
            syms, f = words[i], freq[i]
            if len(syms) < 2:
                continue
            for p in zip(syms, syms[1:]):
                changed[p] -= f
            out, j = [], 0
            while j < len(syms):
                if j + 1 < len(syms) and syms[j] == a and syms[j + 1] == b:
                    out.append(ab)
                    j += 2
                else:
                    out.append(syms[j])
                    j += 1
            words[i] = out
            for p in zip(out, out[1:]):
                changed[p] += f
                pair_words.setdefault(p, set()).add(i)
        for p, delta in changed.items():
            if delta == 0:
                continue
            pair_count[p] += delta
            if pair_count[p] > 0:
                heapq.heappush(heap, (-pair_count[p], p))
            else:
                del pair_count[p]
        pair_count.pop(pair, None)
        if log and len(merges) % 500 == 0:
            log("bpe: %d merges, last %r + %r (%d)" % (len(merges), a, b, -negc))
    return merges


class Tokenizer:
    """A vocabulary: 256 byte tokens in GPT-2 order, one token per merge in
    rank order, then the special tokens."""

    def __init__(self, merges):
        self.merges = list(merges)
        self.token_bytes = [bytes([b]) for b in BYTE_ORDER]
        self.id_of = {t: i for i, t in enumerate(self.token_bytes)}
        for a, b in self.merges:
            if a + b not in self.id_of:
                self.id_of[a + b] = len(self.token_bytes)
                self.token_bytes.append(a + b)
        self.rank = {p: r for r, p in enumerate(self.merges)}
        n = len(self.token_bytes)
        self.special = {s: n + i for i, s in enumerate(SPECIAL_TOKENS)}
        self.n_vocab = n + len(SPECIAL_TOKENS)
        self.eot = self.special["<|endoftext|>"]
        self._cache = {}

    def token_texts(self):
        return [spell(t) for t in self.token_bytes] + SPECIAL_TOKENS

    def token_types(self):
        # llama_token_type: 1 NORMAL, 3 CONTROL
        return [1] * len(self.token_bytes) + [3] * len(SPECIAL_TOKENS)

    def merge_texts(self):
        return ["%s %s" % (spell(a), spell(b)) for a, b in self.merges]

    def _encode_word(self, w):
        ids = self._cache.get(w)
        if ids is not None:
            return ids
        syms = [bytes([b]) for b in w.encode("utf-8")]
        while len(syms) > 1:
            best, best_rank = None, None
            for p in zip(syms, syms[1:]):
                r = self.rank.get(p)
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = p, r
            if best is None:
                break
            a, b = best
            out, j = [], 0
            while j < len(syms):
                if j + 1 < len(syms) and syms[j] == a and syms[j + 1] == b:
                    out.append(a + b)
                    j += 2
                else:
                    out.append(syms[j])
                    j += 1
            syms = out
        ids = [self.id_of[s] for s in syms]
        self._cache[w] = ids
        return ids

    def encode(self, text):
        """Ids of plain text (no special-token parsing, no BOS)."""
        out = []
        for w in pretokenize(text):
            out.extend(self._encode_word(w))
        return out

    def decode(self, ids):
        parts = []
        for i in ids:
            if i < len(self.token_bytes):
                parts.append(self.token_bytes[i])
            else:
                parts.append(SPECIAL_TOKENS[i - len(self.token_bytes)].encode())
        return b"".join(parts).decode("utf-8", errors="replace")
