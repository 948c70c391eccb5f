"""The scanned checkpoint (frozen, columnar), its tables, naming and the scan entry point."""
