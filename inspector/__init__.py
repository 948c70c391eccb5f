"""checkpoint-inspector core."""
