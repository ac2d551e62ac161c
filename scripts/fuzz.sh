#!/usr/bin/env bash
# libFuzzer runs of the loaders and parsers (CI runs it after scripts/sanitize.sh; runnable alone):
# builds the targets of fuzz/ (clang-14, ASan+UBSan, in the build folder scripts/sanitize.sh asan
# uses, so the core is compiled once for both), writes each target's seed corpus from the
# repository's own files, then runs each for TESSERA_FUZZ_SECONDS (default 45) seconds.
#   scripts/fuzz.sh                 every target
#   scripts/fuzz.sh fuzz_gguf ...   those named
# A finding stops its run and leaves the input in <build>/fuzz-artifacts/; replay it with
# `<build>/bin/<target> <file>`, and turn it into a regression test in tests/. Prints each time.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${TESSERA_FUZZ_SECONDS:-45}
# A fixed seed by default: a CI run explores the same inputs each time (TESSERA_FUZZ_SEED=0: random).
seed=${TESSERA_FUZZ_SEED:-1}
dir=${TESSERA_ASAN_BUILD_DIR:-build-asan}
shared=${TESSERA_SHARED_DIR:-../shared}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_gguf fuzz_pipeline fuzz_tokenizer fuzz_openai_request fuzz_grammar)

start=$SECONDS
scripts/sanitize.sh configure
cmake --build "$dir" -j "$(nproc)" --target fuzzers
echo "== fuzz: build took $((SECONDS - start)) s"

corpus=$dir/fuzz-corpus
artifacts=$dir/fuzz-artifacts
rm -rf "$corpus"
mkdir -p "$artifacts"
mkdir -p "$corpus"/{fuzz_gguf,fuzz_pipeline,fuzz_tokenizer,fuzz_openai_request,fuzz_grammar}

# Seeds, from the repository's own files (regenerated on every run; nothing binary is committed).
"$dir/bin/make_fuzz_seeds" "$corpus/fuzz_gguf" >/dev/null
cp pipelines/*.yaml "$corpus/fuzz_pipeline/"
python3 - "$corpus" "$shared/vocab" tests/cli <<'EOF'
import glob, json, os, re, sys
corpus, vocab_dir, serve_tests = sys.argv[1:4]
# fuzz_tokenizer: byte 0 picks the vocabulary (its order in fuzz_tokenizer.cpp) and flags, byte 1
# even = encode; the text is one of llama.cpp's test inputs for that vocabulary.
vocabs = ["llama-spm", "phi-3", "gpt-2", "falcon", "deepseek-llm", "starcoder"]
n = 0
for i, name in enumerate(vocabs):
    path = os.path.join(vocab_dir, "ggml-vocab-%s.gguf.inp" % name)
    if not os.path.exists(path):
        continue
    texts = open(path, "rb").read().split(b"\n__ggml_vocab_test__\n")
    for j, text in enumerate(texts):
        for flags in (0, 3):  # plain; BOS/EOS and control tokens' texts as tokens
            open(os.path.join(corpus, "fuzz_tokenizer", "%s-%d-%d" % (name, j, flags)), "wb").write(
                bytes([i + len(vocabs) * flags, 0]) + text)
            n += 1
print("fuzz seeds: %d tokenizer inputs" % n)
# fuzz_openai_request: the JSON request bodies the server tests send; byte 0 picks the endpoint
# ('0' completions, '1' chat, '2' tokenize, '3' detokenize).
n = 0
for path in sorted(glob.glob(os.path.join(serve_tests, "*.cpp"))):
    for body in re.findall(r'R"\((.*?)\)"', open(path, encoding="utf-8").read(), re.S):
        try:
            value = json.loads(body)
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        kinds = "3" if "tokens" in value else "1" if "messages" in value else "02"
        for k in kinds:
            open(os.path.join(corpus, "fuzz_openai_request", "%s-%d-%s" % (os.path.basename(path), n, k)),
                 "w", encoding="utf-8").write(k + body)
        n += 1
print("fuzz seeds: %d request bodies" % n)
# fuzz_grammar: byte 0 picks the type ('0' GBNF, '1' regex, '2' JSON Schema, '3' choices): the real
# schemas, and the GBNF and regular expressions of the grammar tests.
n = 0
for path in sorted(glob.glob(os.path.join(os.path.dirname(vocab_dir), "schemas", "*.json")))[:40]:
    open(os.path.join(corpus, "fuzz_grammar", "schema-" + os.path.basename(path)), "wb").write(b"2" + open(path, "rb").read())
    n += 1
seeds = ['0root ::= "a" ("b" | "cd")* "e"?\n', '0root ::= [0-9]+ ("." [0-9]{2,3})?\n',
         '0root ::= value\nvalue ::= "[" (value ("," value)*)? "]" | "0"\n', '0root ::= [\\u0080-\\U0001F600]+\n',
         '1\\d{3}-\\d{4}', '1[A-Z][a-z]+(a|bc)*d', '1^(\\w+\\s?)*$', '3["yes", "no", "maybe"]']
for i, s in enumerate(seeds):
    open(os.path.join(corpus, "fuzz_grammar", "text-%d" % i), "w", encoding="utf-8").write(s)
    n += 1
print("fuzz seeds: %d grammar inputs" % n)
EOF

failed=()
for t in "${targets[@]}"; do
  t0=$SECONDS
  echo "== fuzz: $t for ${seconds} s ($(ls "$corpus/$t" | wc -l) seeds)"
  if ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     TESSERA_FUZZ_VOCAB_DIR="$shared/vocab" \
     "$dir/bin/$t" -seed="$seed" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
       -artifact_prefix="$artifacts/$t-" "$corpus/$t" >"$dir/$t.log" 2>&1; then
    echo "== fuzz: $t clean: $(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$dir/$t.log" | grep -Eo '[0-9]+$') runs in $((SECONDS - t0)) s"
  else
    echo "== fuzz: $t FOUND A PROBLEM ($dir/$t.log, input in $artifacts/):"
    # libFuzzer's own findings (timeout, out of memory) print '==PID== ERROR: libFuzzer: ...'.
    { grep -E -A14 'ERROR: |runtime error|terminate called|what\(\)' "$dir/$t.log" |
        grep -v -E 'in (fuzzer::|__sanitizer|std::|__libc|_start|abort|raise|__pthread)' | head -30; } || true
    failed+=("$t")
  fi
done
echo "== fuzz: total $((SECONDS - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "== fuzz: findings in ${failed[*]}" >&2
  exit 1
fi
