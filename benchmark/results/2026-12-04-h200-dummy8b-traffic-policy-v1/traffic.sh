#!/bin/bash
# Traffic comparison: servers up at once (equal KV pools), each workload sent to each server
# in turn (order rotating). Usage: SGLANG_OFFLINE_ENV=<offline sglang 0.5.17> bash traffic.sh "plain dynamic" "w1 w2 ..."
# (from the repository root; vbench.py beside this script)
CONFIGS=$1; WORKLOADS=$2
T0=$(date +%s)
source $SGLANG_OFFLINE_ENV/setup.sh && python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . 2>&1 | tail -2
K=$SGLANG_OFFLINE_ENV
COMMON="--model-path $K/models/llama8b --load-format dummy --attention-backend triton --sampling-backend pytorch --disable-prefill-cuda-graph --cuda-graph-max-bs 128 --max-total-tokens 120000"
SPEC="--speculative-draft-model-path $K/models/eagle3-llama8b --speculative-draft-load-format dummy --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
declare -A PORT FLAGS
PORT[plain]=30010; FLAGS[plain]=""
PORT[eagle3]=30011; FLAGS[eagle3]="$SPEC --speculative-algorithm EAGLE3"
PORT[dynamic]=30012; FLAGS[dynamic]="$SPEC --speculative-algorithm EAGLE3_DYNAMIC"
FRACS=(0.30 0.55 0.80)
i=0
for c in $CONFIGS; do
  env SGLANG_SIMULATE_ACC_LEN=${ACC:-3.0} ${EXTRA_ENV} SGLANG_DYNAMIC_EAGLE_TRACE=$OUT/trace_$c.jsonl \
    python3 -m sglang.launch_server $COMMON ${FLAGS[$c]} --mem-fraction-static ${FRACS[$i]} --port ${PORT[$c]} > $OUT/server_$c.log 2>&1 &
  for s in $(seq 1 240); do grep -q "KV Cache is allocated" $OUT/server_$c.log 2>/dev/null && break; sleep 1; done
  i=$((i+1))
done
for c in $CONFIGS; do
  for s in $(seq 1 300); do curl -s localhost:${PORT[$c]}/health >/dev/null 2>&1 && break; sleep 1; done
  curl -s localhost:${PORT[$c]}/health >/dev/null 2>&1 || { echo "$c not up"; grep -v server_args $OUT/server_$c.log | tail -40; exit 1; }
done
echo "servers up after $(( $(date +%s) - T0 ))s"
rm -f $OUT/trace_plain.jsonl $OUT/trace_eagle3.jsonl
B="python3 $(dirname "$0")/vbench.py --backend sglang --dataset-name random-ids --tokenizer $K/models/llama8b --disable-tqdm --warmup-requests 1"
wl_args() {
  case $1 in
    overload40) echo "--request-rate 40 --num-prompts 320 --random-input-len 1024 --random-output-len 512 --random-range-ratio 0.05 --seed 11";;
    poisson14) echo "--request-rate 14 --num-prompts 168 --random-input-len 1024 --random-output-len 512 --random-range-ratio 0.05 --seed 12";;
    poisson8) echo "--request-rate 8 --num-prompts 96 --random-input-len 1024 --random-output-len 512 --random-range-ratio 0.05 --seed 13";;
    poisson1.6) echo "--request-rate 1.6 --num-prompts 24 --random-input-len 1024 --random-output-len 512 --random-range-ratio 0.05 --seed 14";;
    step-light) echo "--request-rate 2 --num-prompts 16 --random-input-len 512 --random-output-len 256 --random-range-ratio 0.5 --seed 15";;
    step-wave) echo "--max-concurrency 128 --num-prompts 256 --random-input-len 512 --random-output-len 256 --random-range-ratio 1.0 --seed 16";;
    long1) echo "--max-concurrency 1 --num-prompts 3 --random-input-len 8192 --random-output-len 256 --random-range-ratio 1.0 --seed 17";;
    long8) echo "--max-concurrency 8 --num-prompts 16 --random-input-len 8192 --random-output-len 256 --random-range-ratio 1.0 --seed 18";;
    long32) echo "--max-concurrency 32 --num-prompts 48 --random-input-len 8192 --random-output-len 256 --random-range-ratio 1.0 --seed 19";;
    closed1) echo "--max-concurrency 1 --num-prompts 6 --random-input-len 512 --random-output-len 256 --random-range-ratio 1.0 --seed 20";;
    closed16) echo "--max-concurrency 16 --num-prompts 48 --random-input-len 512 --random-output-len 256 --random-range-ratio 1.0 --seed 21";;
    closed64) echo "--max-concurrency 64 --num-prompts 128 --random-input-len 512 --random-output-len 256 --random-range-ratio 1.0 --seed 22";;
  esac
}
n=0
for w in $WORKLOADS; do
  order=($CONFIGS); k=${#order[@]}; rot=$((n % k)); n=$((n+1))
  for j in $(seq 0 $((k-1))); do
    c=${order[$(( (j + rot) % k ))]}
    echo "{\"workload\":\"$w\",\"config\":\"$c\",\"t_start\":$(date +%s.%N)}" >> $OUT/marks.jsonl
    $B --port ${PORT[$c]} $(wl_args $w) --output-file $OUT/results.jsonl --tag "$w|$c" > $OUT/bench_${w}_$c.log 2>&1 || tail -5 $OUT/bench_${w}_$c.log
    if [ $c = dynamic ]; then curl -s localhost:${PORT[$c]}/server_info | python3 -c "
import json,sys; d=json.load(sys.stdin); s=d.get('internal_states',[{}])[0].get('dynamic_eagle',{}); s['workload']='$w'; print(json.dumps(s))" >> $OUT/dynamic_info.jsonl; fi
  done
  echo "$w done at $(( $(date +%s) - T0 ))s"
  [ $(( $(date +%s) - T0 )) -gt ${BUDGET:-520} ] && { echo "time budget reached"; break; }
done
python3 - <<'PY'
import json,os
out=os.environ['OUT']; rows={}
for l in open(f'{out}/results.jsonl'):
    r=json.loads(l); w,c=r['tag'].split('|'); rows[(w,c)]=r
ws=[]; [ws.append(w) for w,_ in rows if w not in ws]
cs=[]; [cs.append(c) for _,c in rows if c not in cs]
print('| workload | config | req/s | out tok/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | E2E p50 | E2E p99 |')
for w in ws:
    for c in cs:
        r=rows.get((w,c))
        if not r: continue
        print(f"| {w} | {c} | {r['request_throughput']:.2f} | {r['output_throughput']:.0f} | {r['median_ttft_ms']:.0f} | {r['p99_ttft_ms']:.0f} | {r['median_tpot_ms']:.1f} | {r['p99_tpot_ms']:.1f} | {r['median_e2e_latency_ms']:.0f} | {r['p99_e2e_latency_ms']:.0f} |")
    if (w,'dynamic') in rows and (w,'plain') in rows:
        d,p=rows[(w,'dynamic')],rows[(w,'plain')]
        print(f"|  {w} dyn/plain | | | {d['output_throughput']/p['output_throughput']:.3f} | {d['median_ttft_ms']/p['median_ttft_ms']:.2f} | {d['p99_ttft_ms']/p['p99_ttft_ms']:.2f} | | | {d['median_e2e_latency_ms']/p['median_e2e_latency_ms']:.2f} | {d['p99_e2e_latency_ms']/p['p99_e2e_latency_ms']:.2f} |")
PY
for f in $OUT/dynamic_info.jsonl; do python3 -c "
import json
for l in open('$f'):
    s=json.loads(l); print(s['workload'], {k:s.get(k) for k in ['speculative_steps','plain_steps','switches_to_plain','switches_to_speculative','probes','acceptance_estimate','prediction_error','catchup_tokens','mismatched_results','acceptance_mismatched_results']})
print('plain cost', s.get('plain_cost')); print('spec cost', s.get('speculative_cost'))"; done
grep -iE "Traceback|Error" $OUT/server_*.log | grep -v soundfile | head -10
for f in $OUT/trace_*.jsonl; do [ -f $f ] && xz -9 $f; done
rm -f $OUT/bench_*.log
echo "total $(( $(date +%s) - T0 ))s"
