"""The LLM generator and what it needs to talk to language models: an OpenAI-compatible chat
client (client), the prompts built from what the search knows (prompts, with their text in
templates/), strict extraction of the candidate from an answer (extract), and the generator
over them (generator).
"""
