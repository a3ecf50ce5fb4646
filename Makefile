.PHONY: demo test bench lint
demo:  ## set up .venv and run the demo replay
	bash scripts/demo.sh
test:  ## set up .venv (+ redis-server) and run every test, as CI does
	bash scripts/test.sh
bench:  ## CPU benchmarks (prints tables; results go in benchmarks/RESULTS.md by hand)
	bash scripts/setup.sh test && .venv/bin/python benchmarks/bench_cpu.py
lint:
	.venv/bin/ruff check atc_stream tests benchmarks examples && .venv/bin/ruff format --check atc_stream tests benchmarks examples && .venv/bin/lint-imports && .venv/bin/mypy
