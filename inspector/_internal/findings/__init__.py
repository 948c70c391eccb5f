"""Findings, the one Code table, and how findings group into issues with the fix for each."""
