# Two commands on a fresh machine: `make demo` (install + run the embedded demo) and `make test`.
PY ?= python3

.PHONY: install demo test kernels

install:
	$(PY) -m pip install -q -e '.[dev,kernels]'

demo: install
	$(PY) -m inferno run --no-thinking --max-new 64 --prompt "Tell me about fire."

test:
	$(PY) -m pytest -q

# Cubins for both target archs into .gpu/kernels (what tools/gpu_tests.sh carries to a GPU machine).
kernels:
	$(PY) -m inferno kernels build --arch sm_90a --arch sm_120a --out .gpu/kernels
