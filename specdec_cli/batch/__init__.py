"""`specdec batch`: a file of requests in OpenAI's Batch format answered with one model load, through
serve's own parsing and generation (requests.py reads the file, results.py keeps what finished, runner.py
answers the rest)."""
