"""Test-only backend plugin (installed by .ci/run): two accelerator backends whose availability is
switched by environment variables, and a broken entry point."""
