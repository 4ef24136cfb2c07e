"""Numerics helpers shared by tests, benchmarks and the conformance suite (device-neutral)."""
