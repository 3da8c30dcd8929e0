"""`specdec serve`: OpenAI-compatible HTTP in front of a Session."""
