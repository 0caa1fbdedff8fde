#!/usr/bin/env python3
"""quant-sens.py -- per-tensor sensitivity and a bit allocation under a budget.

    python3 bench/quant-sens.py -m MODEL.gguf --calib TEXT [--types i3_b64,i4_b64,i6_b64]
                                [--bpw 4.5] [--tensors GLOB] [--out sens.json] [-- QUANTIZE_ARGS...]

For every 2-D tensor of MODEL (names from `sparrow quantize -v`'s report) and
every type, quantizes that tensor alone (policy "NAME TYPE", everything else
F32, calibrated on TEXT) and measures the mean KL divergence from MODEL with
`sparrow eval --gen 3072 --seed 99`: text sampled from MODEL itself, so no
evaluation text is tuned on.  Results are cached in --out (rerun to resume).
Then a multiple-choice knapsack picks one type per tensor minimising the sum
of the measured KLs under the bits-per-weight budget (tensor bytes as eval
counts them; 1-D tensors, and matrices --tensors leaves out, F32) and prints
it as a policy file.  The sum of
single-tensor KLs predicted the whole model's within ~5% on stories260K
(docs/QUANT.md, "Issue 5, acceptance 2").

Environment: SPARROW (default build/sparrow beside this script).
"""
import argparse, json, os, re, subprocess, sys, tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPARROW = os.environ.get("SPARROW", os.path.join(root, "build", "sparrow"))


def run(args):
    return subprocess.run([SPARROW] + args, check=True, capture_output=True, text=True)


def tensors(model, tmp):
    """(name, ne0, ne1) of every tensor, from quantize's per-tensor report."""
    pol = os.path.join(tmp, "all-f32.txt")
    open(pol, "w").write("* F32\n")
    r = run(["quantize", model, os.path.join(tmp, "f32.gguf"), "--policy-file", pol])
    out = []
    for line in r.stderr.splitlines():
        m = re.match(r"\[\s*\d+/\s*\d+\]\s+(\S+)\s+\S+\s+\[(\d+)(?:,\s*(\d+))?\]", line)
        if m:
            out.append((m.group(1), int(m.group(2)), int(m.group(3) or 1)))
    return out


def row_bytes(t, ne0):
    """Bytes of a row of ne0 elements: native names i<bits>[a|n]_b<block>[_e8], or F32/F16."""
    if t in ("F32", "F16"):
        return ne0 * (4 if t == "F32" else 2)
    m = re.fullmatch(r"i(\d)([an]?)_b(\d+)(_e8)?", t)
    if not m:
        sys.exit("quant-sens.py: cannot size type %s" % t)
    bits, kind, blk, e8 = int(m.group(1)), m.group(2), int(m.group(3)), m.group(4)
    head = 4 if kind == "a" else 1 if e8 else 2
    return -(-ne0 // blk) * (head + blk * bits // 8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--calib", required=True)
    ap.add_argument("--types", default="i3_b64,i4_b64,i6_b64")
    ap.add_argument("--bpw", type=float, default=4.5)
    ap.add_argument("--tensors", default="*")
    ap.add_argument("--out", default="sens.json")
    ap.add_argument("rest", nargs="*", help="extra sparrow quantize arguments (after --)")
    a = ap.parse_args()
    types = a.types.split(",")
    res = json.load(open(a.out)) if os.path.exists(a.out) else {}
    with tempfile.TemporaryDirectory() as tmp:
        ts = tensors(a.model, tmp)
        import fnmatch
        mats = [t for t in ts if t[2] > 1 and fnmatch.fnmatch(t[0], a.tensors)]
        for name, ne0, ne1 in mats:
            for t in types:
                key = name + " " + t
                if key in res:
                    continue
                pol, out = os.path.join(tmp, "p.txt"), os.path.join(tmp, "m.gguf")
                open(pol, "w").write("%s %s\n* F32\n" % (name, t))
                run(["quantize", a.model, out, "--policy-file", pol, "--calib", a.calib, "-q"] + a.rest)
                j = json.loads(run(["eval", "-m", out, "--ref", a.model, "--gen", "3072", "--seed", "99",
                                    "-c", "128", "--json"]).stdout)
                res[key] = j["kl_mean"]
                json.dump(res, open(a.out, "w"), indent=0)
                print("%-32s %-10s KL %.6f" % (name, t, j["kl_mean"]), file=sys.stderr)
    n_params = sum(t[1] * t[2] for t in ts)
    # 1-D tensors stay F32; so do matrices outside --tensors (as the policy printed says)
    fixed = sum(row_bytes("F32", t[1]) * t[2] for t in ts if t not in mats)
    cap = int(a.bpw * n_params / 8) - fixed
    G = 8  # bytes per knapsack step
    dp = {0: (0.0, [])}
    for name, ne0, ne1 in mats:
        nd = {}
        for b, (kl, ch) in dp.items():
            for t in types:
                if name + " " + t not in res:
                    continue
                nb = b + -(-row_bytes(t, ne0) * ne1 // G)
                v = kl + res[name + " " + t]
                if nb * G <= cap and (nb not in nd or nd[nb][0] > v):
                    nd[nb] = (v, ch + [(name, t)])
        dp, best = {}, float("inf")
        for b, (v, ch) in sorted(nd.items()):
            if v < best:
                dp[b], best = (v, ch), v
    if not dp:
        sys.exit("quant-sens.py: no allocation fits %.3f bpw" % a.bpw)
    v, ch = min(dp.values(), key=lambda x: x[0])
    by = fixed + sum(row_bytes(t, dict((m[0], m[1]) for m in mats)[n]) * dict((m[0], m[2]) for m in mats)[n]
                     for n, t in ch)
    print("# quant-sens.py: predicted KL %.5f (sum of single-tensor KLs), %.3f bpw" % (v, by * 8 / n_params))
    for n, t in ch:
        print("%-32s %s" % (n, t))
    print("*                                F32")


if __name__ == "__main__":
    main()
