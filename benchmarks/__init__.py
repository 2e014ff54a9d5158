"""Benchmark scripts (run as files: python benchmarks/NAME.py); a regular package so that
`from benchmarks import bench_common` is this folder even where an installed distribution
ships a top-level `benchmarks` package."""
