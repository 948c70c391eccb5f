"""Diagnosis: findings grouped into root causes (issues), each with its fix, and the
references a fix may follow. Above the checks and the load verdict it reads."""
