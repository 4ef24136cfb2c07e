"""agoq-cpu: the AGoQ backend for CPUs (registered as ``cpu`` in the ``agoq.backends`` entry point group)."""
