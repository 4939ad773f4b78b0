"""The `farm` command line: one module per command group, composed in main.py."""
