"""Findings and the one Code table (severity, help and fix of every code), and the words shown
to people. How findings group into issues is `inspector._internal.diagnosis`."""
