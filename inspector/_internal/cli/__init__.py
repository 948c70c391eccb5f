"""The ckpt-inspect command: one module per command."""
