"""The HTTP API that `gov serve` runs: decide, send, subscribe, beacons, metrics."""
