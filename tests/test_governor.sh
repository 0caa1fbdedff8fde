#!/bin/sh
# test_governor.sh -- the governor through the CLI (docs/GOVERNOR.md), the
# sensors simulated with files the test writes: a heat trace 35 -> 48 -> 58
# -> 42 C written while `run --governor` generates steps normal -> warm -> hot
# -> normal, one change per crossing; a battery below 20% and discharging
# gives saver true in the trace with fewer threads and pacing, and on the
# charger the saver is lifted; every trace line is a JSON object with the
# fields the issue names; the flags on run, chat, bench and serve (--help,
# refused without --governor, bad values); bench --json's "governor"
# counters, null when off; a policy file.  Needs python3.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
SPARROW_SHARED=${SPARROW_SHARED:-$root/../shared}

name=governor
. "$root/tests/lib/harness.sh"
need models/stories260K/stories260K.bin || { harness_report; exit 1; }
bin=$fx
need models/stories260K/tok512.bin || { harness_report; exit 1; }
tok=$fx
need models/stories260K-moe/stories260K-moe-f32.gguf || { harness_report; exit 1; }
moe=$fx

# check_trace NAME FILE PYTHON-EXPR: every line parses and has the fields;
# then EXPR (over rows, a list of dicts) must be true
check_trace() {
    if python3 - "$2" "$3" <<'PY' >"$tmp/py" 2>&1; then ok "$1"; else bad "$1" "$(head -c 600 "$tmp/py")"; fi
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
need = ["t_s", "token", "state", "saver", "threads", "n_expert_used", "pacing_ms", "ms_per_token",
        "temp_c", "battery_pct", "charging", "psi_some_avg10", "load_other", "cpu_self_s"]
for r in rows:
    for k in need:
        assert k in r, (k, r)
    assert r["state"] in ("normal", "warm", "hot", "critical"), r
    assert isinstance(r["saver"], bool), r
states = []
for r in rows:
    if not states or states[-1] != r["state"]:
        states.append(r["state"])
ok = eval(sys.argv[2])
if not ok:
    print("states", states)
    for r in rows[:8] + rows[-4:]:
        print(r)
sys.exit(0 if ok else 1)
PY
}

# ---- heat: the temperature file changes while the run goes on ---------------
echo 35000 >"$tmp/temp"
(
    sleep 0.4; echo 48000 >"$tmp/temp.n" && mv "$tmp/temp.n" "$tmp/temp"
    sleep 0.6; echo 58500 >"$tmp/temp.n" && mv "$tmp/temp.n" "$tmp/temp"
    sleep 0.6; echo 42000 >"$tmp/temp.n" && mv "$tmp/temp.n" "$tmp/temp"
) &
writer=$!
# --target-ms keeps each token >= 6 ms, so 400 tokens outlast the script (2.4 s)
sp run -m "$bin" --tokenizer "$tok" -p "Once upon a time" -n 400 --temp 0 -t 2 -c 512 --context-shift \
    --governor --target-ms 6 --thermal-file "$tmp/temp" --trace "$tmp/heat.jsonl"
wait $writer
t_rc "heat run" 0
t_err_has "heat run" "sparrow: governor: state normal"
check_trace "heat: normal -> warm -> hot -> normal, no flapping" "$tmp/heat.jsonl" \
    'states == ["normal", "warm", "hot", "normal"] and all(r["threads"] == 1 for r in rows if r["state"] == "hot") and any(r["temp_c"] == 58.5 for r in rows)'

# ---- hot from the start: half the threads and a duty cycle --------------------
echo 60000 >"$tmp/hot"
sp run -m "$bin" --tokenizer "$tok" -p "Once upon a time" -n 60 --temp 0 -t 2 --governor --thermal-file "$tmp/hot" \
    --trace "$tmp/hot.jsonl"
t_rc "hot run" 0
check_trace "hot: 1 thread, pacing" "$tmp/hot.jsonl" \
    'states == ["hot"] and all(r["threads"] == 1 for r in rows) and all(r["pacing_ms"] > 0 for r in rows if r["token"] > 0)'

# ---- battery saver, and lifted on the charger ------------------------------------
printf '15\nDischarging\n' >"$tmp/bat"
sp run -m "$bin" --tokenizer "$tok" -p "Once upon a time" -n 60 --temp 0 -t 2 --governor --battery-file "$tmp/bat" \
    --thermal-file "$tmp/temp" --trace "$tmp/saver.jsonl"
t_rc "saver run" 0
check_trace "saver: true, fewer threads and pacing" "$tmp/saver.jsonl" \
    'all(r["saver"] for r in rows) and all(r["threads"] == 1 for r in rows) and any(r["pacing_ms"] > 0 for r in rows) and rows[0]["battery_pct"] == 15 and rows[0]["charging"] is False'
printf '15\n' >"$tmp/bat"
sp run -m "$bin" --tokenizer "$tok" -p "Once upon a time" -n 20 --temp 0 -t 2 --governor --battery-file "$tmp/bat" \
    --thermal-file "$tmp/temp" --trace "$tmp/saver2.jsonl"
check_trace "saver: no status line = discharging" "$tmp/saver2.jsonl" 'all(r["saver"] for r in rows)'
printf '15\nCharging\n' >"$tmp/bat"
sp run -m "$bin" --tokenizer "$tok" -p "Once upon a time" -n 60 --temp 0 -t 2 --governor --battery-file "$tmp/bat" \
    --thermal-file "$tmp/temp" --trace "$tmp/charging.jsonl"
check_trace "saver lifted when charging" "$tmp/charging.jsonl" \
    'not any(r["saver"] for r in rows) and all(r["threads"] == 2 for r in rows) and rows[0]["charging"] is True'

# ---- fewer experts (MoE, 2 per token): hot keeps 0.75 x 2 -> 2, critical 0.5 x 2 -> 1
sp run -m "$moe" -p "Once upon a time" -n 20 --temp 0 -t 1 --governor --thermal-file "$tmp/hot" --trace "$tmp/moe.jsonl"
t_rc "moe hot run" 0
check_trace "moe hot: 2 experts" "$tmp/moe.jsonl" 'all(r["n_expert_used"] == 2 for r in rows)'
echo 75000 >"$tmp/critical"
sp run -m "$moe" -p "Once upon a time" -n 20 --temp 0 -t 1 --governor --thermal-file "$tmp/critical" --trace "$tmp/moe.jsonl"
t_rc "moe critical run" 0
check_trace "moe critical: 1 expert" "$tmp/moe.jsonl" 'states == ["critical"] and all(r["n_expert_used"] == 1 for r in rows)'

# ---- a policy file ------------------------------------------------------------
printf '# never hot\nhot.enter_c = 90\ncritical.enter_c = 95\nwarm.duty = 0.9\nreplan_tokens = 5\n' >"$tmp/policy"
sp run -m "$bin" --tokenizer "$tok" -p "Once" -n 30 --temp 0 --governor --governor-policy "$tmp/policy" \
    --thermal-file "$tmp/hot" --trace "$tmp/pol.jsonl"
t_rc "policy run" 0
check_trace "policy: 60 C is warm, a plan every 5 tokens" "$tmp/pol.jsonl" \
    'states == ["warm"] and [r["token"] for r in rows if r["token"]][:2] == [5, 10]'
printf 'hot.nonsense = 1\n' >"$tmp/badpol"
sp run -m "$bin" --tokenizer "$tok" -p "Once" -n 3 --governor --governor-policy "$tmp/badpol"
t_rc "bad policy" 1
t_err_has "bad policy" "badpol:1: unknown key 'hot.nonsense'"

# ---- bench --json --------------------------------------------------------------
sp bench -m "$bin" --tokenizer "$tok" -p 16 -n 16 -r 2 -t 2 --json --governor --thermal-file "$tmp/hot"
t_rc "bench --governor" 0
if python3 -c 'import json,sys; g=json.load(open(sys.argv[1]))["governor"]; assert g["state"]=="hot" and g["tokens"]==32 and g["prefill_tokens"]==32 and g["plans"]>=4 and g["paced_s"]>0 and g["max_temp_c"]==60' "$tmp/out" 2>"$tmp/py"
then ok "bench --json: governor counters"; else bad "bench --json: governor counters" "$(cat "$tmp/py")" "$(show_out)"; fi
sp bench -m "$bin" --tokenizer "$tok" -p 8 -n 4 -r 1 --json
if python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["governor"] is None' "$tmp/out" 2>"$tmp/py"
then ok "bench --json: governor null when off"; else bad "bench --json: governor null when off" "$(cat "$tmp/py")"; fi

# ---- the flags on every command ------------------------------------------------------
for cmd in run chat bench serve; do
    sp $cmd --help
    t_rc "$cmd --help" 0
    t_out_has "$cmd --help" "--governor" "--target-ms MS" "--target-ttft S" "--thermal-file F" "--battery-file F" "--trace FILE"
    t_usage "$cmd --target-ms without --governor" $cmd -m "$bin" --target-ms 50
    t_usage "$cmd --trace without --governor" $cmd -m "$bin" --trace "$tmp/x.jsonl"
done
t_usage "run --target-ms 0" run -m "$bin" --governor --target-ms 0
t_usage "run --target-ms x" run -m "$bin" --governor --target-ms x
t_usage "run --governor=1" run -m "$bin" --governor=1
sp run -m "$bin" --tokenizer "$tok" -p "Once" -n 3 --governor --trace "$tmp/no/such/dir/t.jsonl"
t_rc "trace in a missing folder" 1
t_err_has "trace in a missing folder" "governor trace: cannot create"
# off by default: no governor line
sp run -m "$bin" --tokenizer "$tok" -p "Once" -n 3
if grep -q "governor" "$tmp/err"; then bad "off by default" "$(show_err)"; else ok "off by default"; fi

# chat: /stats shows the governor
printf 'Hello\n/stats\n' | "$SPARROW" chat -m "$bin" --tokenizer "$tok" -n 8 --governor --thermal-file "$tmp/hot" >"$tmp/out" 2>"$tmp/err"
rc=$?
t_rc "chat --governor" 0
t_out_has "chat --governor /stats" "governor: state hot"

harness_report
