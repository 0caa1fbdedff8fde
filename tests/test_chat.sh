#!/bin/sh
# test_chat.sh -- `sparrow chat` from a pipe as a black box (issue 16,
# acceptance 4): on tiny-qwen3 with the chatml template set here, --json
# answers have their keys, and each turn decodes exactly the tokens of what
# its message adds to the rendering (recomputed here with `sparrow template`
# and `sparrow tokenize --special`), within the rule tokens_decoded <= new
# turn's tokens + 2; the same seed gives the same conversation; /reset,
# /save + /load (a conversation continued in another process goes on as
# it would have), --prompt-cache, Ctrl-C-free errors; on stories260K (no
# template) chat says so and falls back to plain turns.  Needs python3 (to
# read the JSON lines).
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
SPARROW_SHARED=${SPARROW_SHARED:-$root/../shared}

name=chat
. "$root/tests/lib/harness.sh"

if [ ! -x "$SPARROW" ]; then
    bad "binary $SPARROW not found (run make first)"
    harness_report
fi
if ! command -v python3 >/dev/null 2>&1; then
    bad "python3 not found: it is needed to read the JSON answers"
    harness_report
fi

# ---- usage ------------------------------------------------------------------------------
sp chat --help
t_rc "--help" 0
t_out_has "--help" "--system-prompt" "--chat-template" "--jinja" "--no-jinja" "--json" "--n-predict" "--temp" \
    "--top-k" "--top-p" "--min-p" "--repeat-penalty" "--presence-penalty" "--frequency-penalty" "--seed" "--ctx-size" "--cache-type-k" "--context-shift" \
    "--keep" "--prompt-cache" "--mem-budget" "/reset" "/save" "/load" "/system" "/stats" "/help" "Ctrl-C"
t_usage "no model" chat
t_usage "unknown template" chat -m x.gguf --chat-template nosuch
t_usage "unknown option" chat -m x.gguf --frob
t_usage "stray argument" chat -m x.gguf hello
t_usage "--temp -1" chat -m x.gguf --temp -1
t_usage "--json=1" chat -m x.gguf --json=1

need models/tiny-qwen/tiny-qwen3-f32.gguf && qwen=$fx
need models/stories260K/stories260K-f32.gguf && stories=$fx
[ -n "${qwen:-}" ] && [ -n "${stories:-}" ] || harness_report

# chat MODEL ARGS... < input: the conversation in $tmp/out
qargs="-m $qwen --chat-template chatml -c 512 -n 6 --seed 7 -t 1"

# ---- JSON lines on tiny-qwen3 ------------------------------------------------------------
cat >"$tmp/in.jsonl" <<'EOF'
{"role": "system", "content": "Be brief."}
{"role": "user", "content": "Hi"}
{"role": "user", "content": "Tell me more."}
{"role": "user", "content": "And then? \u00e9t\u00e9"}
EOF
# shellcheck disable=SC2086
sp chat $qargs --json <"$tmp/in.jsonl"
t_rc "json" 0
cp "$tmp/out" "$tmp/json1"
# The check: keys, then per turn the difference of the renderings
# (with the new message and the answer's opening, minus the prompt and the
# answer the session holds), tokenized, against tokens_decoded.
cat >"$tmp/check.py" <<'EOF'
import json, subprocess, sys
sparrow, model, msgs_in, answers, tmp = sys.argv[1:6]
lines = [json.loads(l) for l in open(answers, encoding="utf-8")]
msgs, sys_msg = [], []
for l in open(msgs_in, encoding="utf-8"):
    m = json.loads(l)
    if m["role"] == "system": sys_msg = [m]
    else: msgs.append(m)
bad = 0
def fail(s):
    global bad
    bad += 1
    print("FAIL " + s)
def render(conv, gen):
    open(tmp + "/conv.json", "w", encoding="utf-8").write(json.dumps(conv))
    args = [sparrow, "template", "--chat-template", "chatml", "--messages", tmp + "/conv.json"]
    if not gen: args.append("--no-generation-prompt")
    return subprocess.run(args, check=True, capture_output=True).stdout
def ntok(text, bos):
    open(tmp + "/diff.txt", "wb").write(text)
    args = [sparrow, "tokenize", "-m", model, "--special", "--file", tmp + "/diff.txt"]
    if not bos: args.append("--no-bos")
    return len(subprocess.run(args, check=True, capture_output=True).stdout.split())
if len(lines) != len(msgs): fail("%d answers for %d messages" % (len(lines), len(msgs)))
conv, held, prev_past = list(sys_msg), b"", 0
for i, (m, a) in enumerate(zip(msgs, lines)):
    for k in ("text", "tokens_decoded", "tokens_generated", "n_past", "ttft_s", "decode_tps"):
        if k not in a: fail("turn %d lacks %s" % (i + 1, k))
    conv.append(m)
    prompt = render(conv, True)
    if not prompt.startswith(held): fail("turn %d: the rendering does not extend the last one" % (i + 1))
    want = ntok(prompt[len(held):], i == 0)
    new_turn = a["n_past"] - prev_past - a["tokens_generated"]
    bad0 = bad
    if a["tokens_decoded"] != want:
        fail("turn %d: tokens_decoded %d, the new text is %d tokens" % (i + 1, a["tokens_decoded"], want))
    if a["tokens_decoded"] > new_turn + 2:
        fail("turn %d: tokens_decoded %d > new turn's %d + 2" % (i + 1, a["tokens_decoded"], new_turn))
    if not (a["tokens_generated"] <= 6 and a["ttft_s"] > 0 and a["decode_tps"] >= 0):
        fail("turn %d: figures %r" % (i + 1, a))
    if bad == bad0: print("ok   turn %d: %d tokens decoded = the new text's, n_past %d" % (i + 1, a["tokens_decoded"], a["n_past"]))
    held = prompt + a["text"].encode("utf-8")
    conv.append({"role": "assistant", "content": a["text"]})
    prev_past = a["n_past"]
sys.exit(1 if bad else 0)
EOF
if python3 "$tmp/check.py" "$SPARROW" "$qwen" "$tmp/in.jsonl" "$tmp/json1" "$tmp" >"$tmp/check.log" 2>&1; then
    ok "json: keys, tokens_decoded per turn = the rendering's difference"
else
    bad "json: the turns' check failed" "$(cat "$tmp/check.log")" "$(head -c 600 "$tmp/json1")"
fi
if python3 -c 'import sys; [l.encode("utf-8") for l in open(sys.argv[1], encoding="utf-8", errors="strict")]' \
    "$tmp/json1" 2>/dev/null; then ok "json: valid UTF-8"; else bad "json: output is not valid UTF-8"; fi

# the same seed, the same conversation (timings aside); another seed, another one
untimed() { sed 's/"ttft_s": [^,]*, "decode_tps": [^,]*, //' "$1"; }
untimed "$tmp/json1" >"$tmp/json1.untimed"
# shellcheck disable=SC2086
sp chat $qargs --json <"$tmp/in.jsonl"
if untimed "$tmp/out" | cmp -s - "$tmp/json1.untimed"; then ok "json: same seed, same conversation"; else
    bad "json: the same seed gave another conversation" "$(show_out)"; fi
# shellcheck disable=SC2086
sp chat $qargs --json --seed 8 --temp 1.5 --top-k 0 <"$tmp/in.jsonl"
if untimed "$tmp/out" | cmp -s - "$tmp/json1.untimed"; then bad "json: another seed gave the same conversation"; else
    ok "json: another seed, another conversation"; fi

# a bad line: an error object, the conversation goes on, exit 1
printf '%s\n' '{"role": "user", "content": "Hi"}' 'not json' '{"role": "bot", "content": "x"}' \
    '{"role": "user", "content": "Tell me more."}' >"$tmp/bad.jsonl"
# shellcheck disable=SC2086
sp chat $qargs --json <"$tmp/bad.jsonl"
t_rc "json bad lines" 1
n_err=$(grep -c '^{"error": ' "$tmp/out"); n_ans=$(grep -c '^{"text": ' "$tmp/out")
if [ "$n_err" = 2 ] && [ "$n_ans" = 2 ]; then ok "json bad lines: 2 errors, 2 answers"; else
    bad "json bad lines: $n_err errors, $n_ans answers" "$(show_out)"; fi

# ---- text lines on tiny-qwen3: /reset, /save, /load, /stats ------------------------------
printf 'Hi\nTell me more.\nAnd then?\n' >"$tmp/three.txt"
# shellcheck disable=SC2086
sp chat $qargs <"$tmp/three.txt"
t_rc "pipe" 0
cp "$tmp/out" "$tmp/three.out"
if [ "$(wc -l <"$tmp/three.out")" -eq 3 ]; then ok "pipe: one answer line per message"; else
    bad "pipe: $(wc -l <"$tmp/three.out") lines for 3 messages" "$(show_out)"; fi
# /reset starts again: the first message gets the first answer again
printf 'Hi\n/reset\nHi\n' >"$tmp/reset.txt"
# shellcheck disable=SC2086
sp chat $qargs <"$tmp/reset.txt"
a1=$(sed -n 1p "$tmp/out"); a2=$(sed -n 2p "$tmp/out")
if [ "$rc" -eq 0 ] && [ "$a1" = "$a2" ] && [ "$a1" = "$(sed -n 1p "$tmp/three.out")" ]; then
    ok "/reset: the same first answer"; else bad "/reset: '$a1' then '$a2'" "$(show_err)"; fi
# /save after two turns; /load in another process; the third turn as in one process
printf 'Hi\nTell me more.\n/save %s\n' "$tmp/conv.ses" >"$tmp/save.txt"
# shellcheck disable=SC2086
sp chat $qargs <"$tmp/save.txt"
if [ "$rc" -eq 0 ] && [ -s "$tmp/conv.ses" ] && [ -s "$tmp/conv.ses.json" ]; then ok "/save: FILE and FILE.json"; else
    bad "/save: exit $rc" "$(show_err)"; fi
printf '/load %s\nAnd then?\n/stats\n' "$tmp/conv.ses" >"$tmp/load.txt"
# shellcheck disable=SC2086
sp chat $qargs --seed 99 <"$tmp/load.txt"
if [ "$rc" -eq 0 ] && [ "$(sed -n 1p "$tmp/out")" = "$(sed -n 3p "$tmp/three.out")" ]; then
    ok "/load: the conversation goes on as in one process"; else
    bad "/load: '$(sed -n 1p "$tmp/out")', want '$(sed -n 3p "$tmp/three.out")'" "$(show_err)"; fi
t_out_has "/stats" "tokens decoded" "time to first token" "positions used" "memory"
printf '/load %s\n' "$tmp/nosuch" | "$SPARROW" chat $qargs >"$tmp/out" 2>"$tmp/err"
t_err_has "/load missing" "nosuch.json is missing"
printf '/frob\n/help\n' | "$SPARROW" chat $qargs >"$tmp/out" 2>"$tmp/err"
t_err_has "unknown command" "unknown command '/frob'"
t_out_has "/help" "/reset" "/system TEXT"

# --prompt-cache: the system prompt decoded once, reused the second time, same answers
# shellcheck disable=SC2086
sp chat $qargs -sys "Be brief." --prompt-cache "$tmp/sys.ses" <"$tmp/three.txt"
cp "$tmp/out" "$tmp/pc1.out"
# shellcheck disable=SC2086
sp chat $qargs -sys "Be brief." --prompt-cache "$tmp/sys.ses" <"$tmp/three.txt"
t_err_has "--prompt-cache" "system prompt tokens reused"
if [ "$rc" -eq 0 ] && cmp -s "$tmp/out" "$tmp/pc1.out"; then ok "--prompt-cache: the same answers"; else
    bad "--prompt-cache: answers differ" "$(show_out)" "$(show_err)"; fi

# a full context: the message is refused, the chat goes on, exit 1
printf 'Hi\nTell me more.\n' >"$tmp/two.txt"
sp chat -m "$qwen" --chat-template chatml -c 64 -n 6 --seed 7 -t 1 <"$tmp/two.txt"
t_rc "context full" 1
t_err_has "context full" "does not fit in the context"

# ---- stories260K: no template, plain turns ----------------------------------------------
printf 'Once upon a time\nThe cat\n' >"$tmp/story.txt"
sp chat -m "$stories" -n 8 --seed 5 -t 1 <"$tmp/story.txt"
t_rc "plain" 0
t_err_has "plain" "no chat template" "plain turns"
if [ "$(wc -l <"$tmp/out")" -eq 2 ]; then ok "plain: two answers"; else bad "plain: $(wc -l <"$tmp/out") lines" "$(show_out)"; fi
cp "$tmp/out" "$tmp/story1.out"
sp chat -m "$stories" -n 8 --seed 5 -t 1 <"$tmp/story.txt"
if cmp -s "$tmp/out" "$tmp/story1.out"; then ok "plain: same seed, same conversation"; else bad "plain: differs" "$(show_out)"; fi
# the first plain turn is the message itself: as `run` continues it, greedily
sp chat -m "$stories" -n 8 --temp 0 -t 1 <<'EOF'
Once upon a time
EOF
head -n 1 "$tmp/out" | tr -d '\n' >"$tmp/chat1"
sp run -m "$stories" -p "Once upon a time" -n 8 --temp 0 -t 1
if cmp -s "$tmp/out" "$tmp/chat1"; then ok "plain: the first turn continues the text as run does"; else
    bad "plain: chat '$(cat "$tmp/chat1")' vs run '$(cat "$tmp/out")'"; fi
# plain turns decode the new line only: "\n" + the message
printf '%s\n' '{"role": "user", "content": "Once upon a time"}' '{"role": "user", "content": "The cat"}' >"$tmp/story.jsonl"
sp chat -m "$stories" -n 8 --seed 5 -t 1 --json <"$tmp/story.jsonl"
d2=$(sed -n 2p "$tmp/out" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["tokens_decoded"])')
want=$(printf '\nThe cat' | "$SPARROW" tokenize -m "$stories" --no-bos --file - | wc -w)
if [ "$d2" = "$want" ]; then ok "plain: turn 2 decodes its $want tokens"; else bad "plain: turn 2 decoded $d2, want $want"; fi

# ---- a terminal (a pseudo-terminal): libedit, Ctrl-C, Ctrl-D ----------------------------
# stories260K never ends a story with EOS, so with -n -1 and --context-shift the answer
# runs until Ctrl-C stops it; the conversation goes on (/stats), Ctrl-C at the empty
# prompt does no harm, Ctrl-D quits with 0 (a hang is killed after 20 s and fails).
cat >"$tmp/terminal.py" <<'EOF'
import os, pty, select, sys, time
sparrow, model = sys.argv[1:3]
pid, fd = pty.fork()
if pid == 0:
    os.execv(sparrow, [sparrow, "chat", "-m", model, "-n", "-1", "--context-shift", "--keep", "4", "-c", "128",
                       "--seed", "3", "-t", "1"])
out = b""
def read_for(sec, until=None, since=0):
    # read for sec seconds, or until `until` shows up after offset `since`
    global out
    end = time.time() + sec
    while time.time() < end:
        if until and until in out[since:]: return
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try: d = os.read(fd, 65536)
            except OSError: return
            if not d: return
            out += d
read_for(20, b"> ")
os.write(fd, b"Once upon a time\r")
read_for(20, b"Lily")            # the answer streams
read_for(0.5)
os.write(fd, b"\x03")
read_for(20, b"(interrupted)")
read_for(20, b"> ", out.find(b"(interrupted)"))  # the next prompt
os.write(fd, b"/stats\r")
read_for(20, b"memory:")
read_for(20, b"> ", out.find(b"memory:"))
os.write(fd, b"\x03")   # Ctrl-C at the (empty) prompt: the chat goes on
read_for(0.5)
os.write(fd, b"\x04")   # Ctrl-D on an empty line: the end
st = None
for _ in range(400):     # at most 20 s, then it is a hang
    read_for(0.05)
    done, st = os.waitpid(pid, os.WNOHANG)
    if done: break
else:
    os.kill(pid, 9)
    _, st = os.waitpid(pid, 0)
sys.stdout.buffer.write(out)
sys.exit(os.WEXITSTATUS(st) if os.WIFEXITED(st) else 100 + os.WTERMSIG(st))
EOF
python3 "$tmp/terminal.py" "$SPARROW" "$stories" >"$tmp/out" 2>"$tmp/err"
rc=$?
t_rc "terminal" 0
t_out_has "terminal" "> Once upon a time" "(interrupted)" "(callback)" "positions used"
if grep -q 'dropped by [1-9][0-9]* context shifts' "$tmp/out"; then ok "terminal: the answer ran past the context"; else
    bad "terminal: no context shift before Ctrl-C" "$(show_out)"; fi

harness_report
