"""Generators the worker drives: scripted, openai (OpenAI-compatible servers), llamacpp (in process)."""
