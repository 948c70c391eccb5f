"""The scan entry point, `scan(path)`, and the registry of layout readers it picks from."""
