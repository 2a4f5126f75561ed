# `make check`: what CI checks, in one command (the tests also run ruff and mypy themselves).
PY := .venv/bin
CODE := src app workers scheduler examples tests bench

.PHONY: check format
check:
	$(PY)/ruff format --check $(CODE)
	$(PY)/ruff check $(CODE)
	$(PY)/python -m tests.harness.typecheck
	$(PY)/pytest -q

format:
	$(PY)/ruff format $(CODE)
	$(PY)/ruff check --fix $(CODE)
