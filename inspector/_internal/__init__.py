"""Everything behind the public surface (inspector/__init__.py, inspector.errors, inspector.widgets,
the ckpt-inspect command): private by name; docs/architecture.md draws it."""
