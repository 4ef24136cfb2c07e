"""The ``agoq`` command. Each subcommand lives in its own module with ``register(subparsers)``."""
