"""Parsers of untrusted bytes (safetensors headers, pickles, tensor data, JSON side files' facts):
read, never judge."""
