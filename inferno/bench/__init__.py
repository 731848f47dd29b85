"""`inferno bench`: byte and FLOP accounting, same-run limits, timed runs, reports.

accounting.py  bytes per decode step / FLOPs per prefill token from the artifact inventory
limits.py      copy bandwidth and bf16 GEMM rate measured on the live GPU
profile.py     the optional per-kernel timing protocol an executor may implement
runner.py      warm-up + repetitions through the engine's generation loop, medians and spreads
report.py      JSON schema, text table, docs/performance.md row
"""
