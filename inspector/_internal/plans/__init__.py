"""Writers: every change to a folder is a printable plan that executes atomically with a backup."""
