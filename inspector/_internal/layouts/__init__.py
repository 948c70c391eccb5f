"""One reader module per on-disk layout, each exposing `LAYOUT`: files -> `ScannedCheckpoint`,
never a judgement. The registry that orders them is `inspector._internal.scan.registry`."""
