#!/usr/bin/env bash
# tools/gen_check.sh — on the GPU machine: `dflash generate` on CUDA (two batch sizes, greedy and sampled) and on the
# CPU for the first N demo eval prompts, and how far the outputs agree (greedy: identical rows and the mean common
# prefix; bf16 on CUDA may flip near-ties, after which the continuations differ). Carry .deps. Logs under $OUT.
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.." || exit 1
N=${N:-64}
. tools/device_env.sh  # PCRE2 development files from .deps when the image lacks them
cmake -S . -B build-cuda -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$OUT/configure.log" 2>&1 &&
  cmake --build build-cuda -j 16 --target dflash >"$OUT/build.log" 2>&1 || { grep error "$OUT/build.log" | head; exit 1; }
zcat assets/demo/prompts_eval.jsonl.gz | head -"$N" >"$OUT/prompts.jsonl"
G=(build-cuda/dflash generate --target assets/demo/target --prompts "$OUT/prompts.jsonl" --format raw
   --max-new-tokens 64 --write-ids --no-progress)
run() { local name=$1; shift; local t0=$(date +%s%N); "${G[@]}" "$@" --out "$OUT/$name.jsonl" >"$OUT/$name.log" 2>&1;
        echo "$name rc=$? $(( ($(date +%s%N) - t0) / 1000000 )) ms"; }
run cuda_b16 --device cuda --batch-size 16
run cuda_b5 --device cuda --batch-size 5
run cpu_b16 --device cpu --batch-size 16
run cuda_t08 --device cuda --batch-size 16 --temperature 0.8 --seed 3
run cuda_t08_b5 --device cuda --batch-size 5 --temperature 0.8 --seed 3
python3 - "$OUT" <<'PY'
import json, os, sys
o = sys.argv[1]
rd = lambda n: [json.loads(l) for l in open(os.path.join(o, n + ".jsonl"))]
def cmp(x, y):
    same, pre = 0, []
    for r, s in zip(x, y):
        a, b = r["completion_ids"], s["completion_ids"]
        same += a == b
        p = 0
        while p < min(len(a), len(b)) and a[p] == b[p]:
            p += 1
        pre.append(p)
    return "%d of %d rows identical, mean common prefix %.1f tokens" % (same, len(x), sum(pre) / len(pre))
a, b, c, t, t5 = (rd(n) for n in ("cuda_b16", "cuda_b5", "cpu_b16", "cuda_t08", "cuda_t08_b5"))
print("greedy cuda batch 16 vs batch 5:", cmp(a, b))
print("greedy cuda vs cpu:             ", cmp(a, c))
print("sampled (T 0.8) batch 16 vs 5:  ", cmp(t, t5))
print("sampled vs greedy:              ", cmp(t, a))
print("finish reasons cuda greedy:", sorted({r["finish_reason"] for r in a}), "tokens:", sum(len(r["completion_ids"]) for r in a))
print("example cuda:", repr(a[1]["completion"][:100]))
print("example cpu: ", repr(c[1]["completion"][:100]))
PY
