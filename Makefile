# Two commands on a fresh machine: `make demo` (install + run the embedded demo) and `make test`.
PY ?= python3

.PHONY: install demo test kernels gpu-test

install:
	$(PY) -m pip install -q -e '.[dev,kernels]'

demo: install
	inferno run --no-thinking --max-new 64 --prompt "Tell me about fire."

test:
	$(PY) -m pytest -q

kernels:
	inferno kernels build --arch sm_90a --arch sm_120a
