"""Integrations with training stacks. Each module imports its stack only when used."""
