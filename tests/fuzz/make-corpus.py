#!/usr/bin/env python3
"""make-corpus.py -- (re)write the fuzz targets' seed corpora, tests/fuzz/corpus/<target>/,
from the fixtures in $SPARROW_SHARED (default ../shared).  The output is committed (CI
fuzzes from it without regenerating); run this again only to change the seeds.  Each
seed stays small (a few KiB: libFuzzer runs faster on small inputs, and the repository
takes no file over 512 KiB):

  fuzz_gguf       the fixtures' metadata (hyper-parameters, vocabulary) and tensor
                  directory, every tensor cut to 32 elements (its name and type kept,
                  the offsets laid out anew), so the whole interpretation runs;
  fuzz_llama2c    stories260K's tok512.bin, read for its model and alone; a tiny
                  checkpoint of its config's layout; the real checkpoint's header;
  fuzz_tokenizer  llama.cpp's tokenizer test inputs, one text per seed;
  fuzz_template   the templates of llama.cpp's chat-template test cases (messages: the
                  target's own conversation);
  fuzz_pack, fuzz_session  are not written here: their seeds (a package, a manifest,
                  a patch; a saved stories260K session) are made by the library's own
                  writers and committed as they are.
The first byte of a fuzz_llama2c input is its mode (tests/fuzz/fuzz_llama2c.c)."""
import os
import struct
import sys

root = os.path.dirname(os.path.abspath(__file__))
shared = os.environ.get("SPARROW_SHARED") or os.path.join(root, "..", "..", "..", "shared")
out = os.path.join(root, "corpus")


def fixture(rel):
    p = os.path.join(shared, rel)
    if not os.path.exists(p):
        sys.exit("missing fixture: %s (set SPARROW_SHARED)" % p)
    return open(p, "rb").read()


def write(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- GGUF: header, metadata and directory kept; each tensor's data cut -------------
class Reader:
    def __init__(self, b):
        self.b, self.pos = b, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.b, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.take("Q")
        self.pos += n

    def value(self, t):
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
        if t == 8:
            self.string()
        elif t == 9:
            et, n = self.take("I"), self.take("Q")
            if et in sizes:
                self.pos += sizes[et] * n
            else:
                for _ in range(n):
                    self.value(et)
        else:
            self.pos += sizes[t]


def gguf_cut(b):
    """The same metadata; every tensor 1-D of 32 elements of its type, laid out anew."""
    r = Reader(b)
    assert r.take("I") == 0x46554747  # "GGUF"
    r.take("I")
    n_t, n_kv = r.take("Q"), r.take("Q")
    for _ in range(n_kv):
        r.string()
        r.value(r.take("I"))
    head = bytearray(b[: r.pos])
    bytes_32 = {0: 128, 1: 64, 8: 34, 30: 64}  # F32, F16, Q8_0, BF16
    off = 0
    for _ in range(n_t):
        start = r.pos
        r.string()
        name = b[start: r.pos]
        nd = r.take("I")
        r.pos += 8 * nd
        t = r.take("I")
        r.take("Q")
        head += name + struct.pack("<IQIQ", 1, 32, t, off)
        off += (bytes_32[t] + 31) // 32 * 32
    align = 32  # every fixture uses GGUF's default
    head += b"\0" * ((-len(head)) % align)
    return bytes(head) + bytes(i * 37 % 251 for i in range(off))


for rel in ["models/stories260K/stories260K-q8_0.gguf", "models/tiny-qwen/tiny-qwen3moe-q8_0.gguf",
            "models/stories260K-moe/stories260K-moe-q8_0.gguf", "models/tiny-qwen/tiny-qwen2-q8_0.gguf"]:
    write("fuzz_gguf", os.path.basename(rel).replace(".gguf", "-cut.gguf"), gguf_cut(fixture(rel)))

# ---- llama2.c ---------------------------------------------------------------------------
tok = fixture("models/stories260K/tok512.bin")
write("fuzz_llama2c", "tok512-for-512.bin", bytes([0, 0, 2]) + tok)  # n_vocab 512
write("fuzz_llama2c", "tok512-alone.bin", bytes([0, 0, 0]) + tok)
bin_head = fixture("models/stories260K/stories260K.bin")[:28]
write("fuzz_llama2c", "stories260K-header.bin", bytes([3, 0, 0]) + bin_head)  # vocab_only checkpoint
dim, hidden, layers, heads, kv, vocab, seq = 8, 16, 1, 2, 2, 16, 4
cfg = struct.pack("<7i", dim, hidden, layers, heads, kv, vocab, seq)
floats = vocab * dim + layers * (dim + 4 * dim * dim + dim + 3 * dim * hidden) + dim + seq * (dim // heads)
write("fuzz_llama2c", "tiny-checkpoint.bin", bytes([1, 0, 0]) + cfg + struct.pack("<%df" % floats, *([0.25] * floats)))

# ---- tokenizer texts --------------------------------------------------------------------
texts = fixture("peer-tests/tokenizer/ggml-vocab-llama-spm.gguf.inp").split(b"\n__ggml_vocab_test__\n")
for i, t in enumerate(t for t in texts if t):
    write("fuzz_tokenizer", "inp-%02d.txt" % i, t)
write("fuzz_tokenizer", "story.txt", fixture("peer-tests/../peer-golden/tinystories-valid-excerpt.txt")[:600])

# ---- chat templates: llama.cpp's test cases, one template per seed -------------------------
import json  # noqa: E402

cases = json.loads(fixture("peer-tests/chat-template/cases.json"))["cases"]
for c in cases:
    t = c["template"].encode()
    if len(t) <= 16384:
        write("fuzz_template", "%s.jinja" % "".join(ch if ch.isalnum() else "-" for ch in c["name"]), t)
