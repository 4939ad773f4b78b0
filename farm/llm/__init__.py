"""Talking to language models: an OpenAI-compatible chat client (client), the prompts built
from what the search knows (prompts, with their text in templates/), and strict extraction
of the candidate from an answer (extract). The generator itself is farm.generators.llm.
"""
