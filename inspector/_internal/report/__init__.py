"""Renderers of scans and findings: terminal text, Markdown, HTML, the notebook repr."""
