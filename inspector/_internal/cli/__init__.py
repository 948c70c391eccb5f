"""The ckpt-inspect command: one module per command, and the exit codes they share (here,
where `cli.main` reads them without importing a command: see its `COMMANDS`)."""

# 0 clean, 1 findings (or a refused plan), 2 the command could not do its work.
EXIT_OK, EXIT_FOUND, EXIT_CANNOT = 0, 1, 2
