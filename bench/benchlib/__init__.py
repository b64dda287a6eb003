"""The parts of the side-by-side benchmark, one concern a module; `bench/bench.py` is its entry
point and command line."""
