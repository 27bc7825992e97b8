"""multireduce's benchmarks: ``python -m benchmarks <suite> [options]`` (``python -m benchmarks --help``
lists the suites). Each suite is a module here; ``harness`` holds what they share."""
