"""An entry point that fails to import: must be reported by name without breaking other plugins."""
raise ImportError("agoq_dummy_backend.broken is broken on purpose (test fixture)")
