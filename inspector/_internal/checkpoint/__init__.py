"""The scanned checkpoint (frozen, columnar) and its facts: tables, naming, spec, what a loader
reads. The scan entry point that builds it is `inspector._internal.scan`."""
